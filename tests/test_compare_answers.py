"""The comparison's accuracy against compute per answer: k sampled answers at H_eff h beside
one answer at H_eff k·h, from bench JSONs scored the way the bench stage scores them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline_lib.bench.sampled import sampled_scores
from pipeline_lib.bench.scoring import task_scores
from pipeline_lib.compare import compare_runs
from pipeline_lib.evaluate.heff import sweep_result
from pipeline_lib.evaluate.heff_summary import summarize_heff
from pipeline_lib.evaluate.stats import score_interval, wilson_interval

TASK = "loopline_addition"


def _setting(first: list[float], maj8: list[float] | None, per_answer: float) -> dict:
    """One setting's scores: every question's first answer right or not and, when sampled,
    maj@8 (scored as the bench stage scores lm-eval's per-sample logs)."""
    samples = [{"doc_id": i, "doc": {"level": 1 + i % 2}, "filter": "none", "exact_match": v,
                **({} if maj8 is None else {"maj@8": maj8[i]})} for i, v in enumerate(first)]
    results = {"results": {TASK: {"exact_match,none": sum(first) / len(first)}},
               "samples": {TASK: samples}, "configs": {TASK: {"repeats": 8}}}
    scores = task_scores(results, TASK, "exact_match")
    sampled = sampled_scores(samples, results["configs"][TASK], "exact_match", "level")
    if sampled:
        scores["sampled"] = sampled
        for entry in sampled.values():
            entry["loops_per_answer"] = entry["samples"] * per_answer
    scores["loops_per_answer"] = per_answer
    return scores


def _run(root: Path, name: str, settings: dict[str, dict]) -> dict:
    run = root / name
    (run / "eval").mkdir(parents=True)
    (run / "sweep.json").write_text(json.dumps(sweep_result(20, {1: 2.0, 8: 1.9}, 100)))
    summarize_heff([run / "sweep.json"], run / "eval" / "heff.parquet", run / "eval" / "h.png")
    bench = {"step": 20, "tasks": {TASK: {"builtin": True, "metric": "exact_match",
                                          "h_eff": settings}}}
    (run / "bench.json").write_text(json.dumps(bench))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 20, "loss": 2.0}) + "\n")
    return {"heff": run / "eval" / "heff.parquet", "bench": run / "bench.json",
            "metrics": run / "metrics.jsonl"}


def test_samples_times_depth_against_one_deep_answer(tmp_path: Path):
    first1 = [1.0] * 8 + [0.0] * 12  # H_eff 1: 8 of 20 right with one answer…
    maj8 = [1.0] * 13 + [0.0] * 7  # …13 of 20 by a vote of 8
    first8 = [1.0] * 11 + [0.0] * 9  # H_eff 8: 11 of 20 right with one answer
    # 4 tokens per answer: 4 loops per answer at H_eff 1, 32 at H_eff 8
    inputs = {"loop4": _run(tmp_path, "loop4", {"1": _setting(first1, maj8, 4.0),
                                                "8": _setting(first8, maj8[::-1], 32.0)})}
    out = tmp_path / "compare"
    rows = compare_runs(inputs, out)
    md = (out / "summary.md").read_text()
    table = md.split("## Accuracy against compute per answer")[1].split("\n## ")[0]
    lines = [line for line in table.splitlines() if line.startswith("| loop4 |")]
    lo, hi = wilson_interval(13, 20)
    lo1, hi1 = wilson_interval(11, 20)
    assert lines == [
        f"| loop4 | {TASK} | exact_match | H_eff=1 | 1 | 4.0 | 0.400 "
        f"[{wilson_interval(8, 20)[0]:.2f}, {wilson_interval(8, 20)[1]:.2f}] |",
        f"| loop4 | {TASK} | exact_match | H_eff=8 | 1 | 32.0 | 0.550 [{lo1:.2f}, {hi1:.2f}] |",
        f"| loop4 | {TASK} | maj@8 | H_eff=1 | 8 | 32.0 | 0.650 [{lo:.2f}, {hi:.2f}] |",
        f"| loop4 | {TASK} | maj@8 | H_eff=8 | 8 | 256.0 | 0.650 [{lo:.2f}, {hi:.2f}] |"]

    def row(metric, h):
        (match,) = [r for r in rows if (r["metric"], r["h_eff"], r["level"]) == (metric, h, None)]
        return match

    assert row(f"{TASK}/maj@8", 1)["value"] == 0.65
    assert (row(f"{TASK}/maj@8", 1)["ci_low"], row(f"{TASK}/maj@8", 1)["ci_high"]) == (
        pytest.approx(lo), pytest.approx(hi))
    assert row(f"{TASK}/maj@8/loops_per_answer", 1)["value"] == 32.0
    assert row(f"{TASK}/maj@8/loops_per_answer", 1)["n"] == 8  # the answers it rests on
    assert row(f"{TASK}/exact_match/loops_per_answer", 8)["value"] == 32.0
    assert (out / "accuracy_vs_compute.png").stat().st_size > 0
    single = {"loop4": _run(tmp_path, "greedy", {"1": _setting(first1, None, 4.0)})}
    compare_runs(single, out)  # one answer per question: no table, no figure
    assert "compute per answer" not in (out / "summary.md").read_text()
    assert not (out / "accuracy_vs_compute.png").exists()


def test_pass_at_k_interval_is_the_bootstrap_over_questions():
    first = [1.0, 0.0, 0.0, 1.0]
    samples = [{"doc_id": i, "doc": {}, "filter": "none", "exact_match": v,
                "pass@4": [1.0, 0.5, 0.25, 1.0][i]} for i, v in enumerate(first)]
    got = sampled_scores(samples, {}, "exact_match", None)["pass@4"]
    assert (got["ci_low"], got["ci_high"]) == score_interval([1.0, 0.5, 0.25, 1.0])
