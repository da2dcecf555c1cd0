"""The bench stage with sampled answers (bench.sampling, lm-eval repeats and filters) on the
tiny trained snapshot, through lm_eval.simple_evaluate offline: maj@5 and pass@5 per H_eff
and level with intervals, answers recomputed request by request, the same seed giving the
same bytes run after run, resumed or rebatched, and temperature 0 giving today's greedy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from lm_eval.api.instance import Instance

from pipeline_lib.bench import LooplineLM, run_benchmarks, summarize_bench
from pipeline_lib.bench.sampled import majority, pass_at_k
from pipeline_lib.evaluate.stats import score_interval
from pipeline_lib.spec.config import BenchConfig, BenchSamplingConfig

pytestmark = pytest.mark.slow
TASK = "loopline_addition"
SAMPLING = BenchSamplingConfig(repeats=5, temperature=1.0)


def bench_config(**kwargs) -> BenchConfig:
    kwargs.setdefault("sampling", SAMPLING)
    return BenchConfig(**{"tasks": [TASK], "examples_per_level": 2, "min_difficulty": 1,
                          "max_difficulty": 2, "batch_size": 4, "max_gen_toks": 6,
                          "h_eff": [1, 3], **kwargs})


def without_timings(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("seconds", "setting_seconds")}


@pytest.fixture(scope="module")
def sampled(snapshot_dir, tmp_path_factory):
    """(report, JSON path, tasks dir) of the bench stage with 5 sampled answers per question."""
    out = tmp_path_factory.mktemp("sampled")
    report = run_benchmarks(snapshot_dir, bench_config(), out / "tasks", out / "step.json")
    return report, out / "step.json", out / "tasks"


def direct_answers(snapshot_dir: Path, tasks_dir: Path, h_eff: int, seed: int) -> list[list[str]]:
    """Every question's 5 answers, generated request by request (batch size 1) outside lm-eval
    with the task file's own generation kwargs."""
    cfg = yaml.safe_load((tasks_dir / f"{TASK}.yaml").read_text())
    rows = [json.loads(line) for line in (tasks_dir / f"{TASK}.jsonl").read_text().splitlines()]
    lm = LooplineLM(snapshot=str(snapshot_dir), h_eff=h_eff, batch_size=1, seed=seed)
    answers = []
    for doc_id, row in enumerate(rows):
        one = Instance("generate_until", row, (row["prompt"], cfg["generation_kwargs"]), 0,
                       metadata=(TASK, doc_id, cfg["repeats"]))
        answers.append(lm.generate_until([one] * cfg["repeats"], disable_tqdm=True))
    return answers


def test_maj_and_pass_at_5_per_h_eff_with_intervals_from_the_answers(sampled, snapshot_dir):
    report, _, tasks_dir = sampled
    info = report["tasks"][TASK]
    assert report["bench"]["sampling"] == {"repeats": 5, "temperature": 1.0}
    rows = [json.loads(line) for line in (tasks_dir / f"{TASK}.jsonl").read_text().splitlines()]
    for h in (1, 3):
        scores = info["h_eff"][str(h)]
        assert sorted(scores["sampled"]) == ["maj@5", "pass@1", "pass@5"]
        answers = direct_answers(snapshot_dir, tasks_dir, h, report["bench"]["seed"])
        right = [[a == row["answer"] for a in five] for five, row in zip(answers, rows,
                                                                         strict=True)]
        want = {"maj@5": [float(majority(five) == row["answer"])
                          for five, row in zip(answers, rows, strict=True)],
                "pass@5": [pass_at_k(5, sum(r), 5) for r in right],
                "pass@1": [sum(r) / 5 for r in right]}
        for label, values in want.items():
            entry = scores["sampled"][label]
            assert entry["per_sample"] == {str(d): v for d, v in enumerate(values)}
            assert entry["value"] == pytest.approx(sum(values) / len(values))
            assert (entry["n"], entry["samples"]) == (4, 1 if label == "pass@1" else 5)
            assert (entry["ci_low"], entry["ci_high"]) == score_interval(values)
            assert sorted(entry["levels"]) == ["1", "2"]
            assert all(cell["n"] == 2 for cell in entry["levels"].values())
        assert scores["per_sample"] == {str(d): float(r[0]) for d, r in enumerate(right)}
        # compute: 5 answers × loops per answer; a fixed H_eff computes h loops per token
        per_answer = scores["loops_per_answer"]
        assert scores["sampled"]["maj@5"]["loops_per_answer"] == 5 * per_answer
        assert (per_answer * 4 * 5 / h) == round(per_answer * 4 * 5 / h)  # whole tokens


def test_the_same_seed_gives_the_same_report_rerun_resumed_or_rebatched(sampled, snapshot_dir,
                                                                        tmp_path):
    report, out_json, _ = sampled
    again = run_benchmarks(snapshot_dir, bench_config(), tmp_path / "t1", tmp_path / "a.json")
    assert without_timings(again) == without_timings(report)
    first = json.loads(out_json.read_text())
    assert without_timings(json.loads((tmp_path / "a.json").read_text())) == without_timings(first)
    # the stage run again for H_eff 3 only (the setting an interrupted run had not finished),
    # and at batch size 1: the same answers, so the same scores
    rest = run_benchmarks(snapshot_dir, bench_config(h_eff=[3], batch_size=1), tmp_path / "t2",
                          None)
    assert rest["tasks"][TASK]["h_eff"]["3"]["sampled"] == (
        report["tasks"][TASK]["h_eff"]["3"]["sampled"])
    other = run_benchmarks(snapshot_dir, bench_config(seed=10_001), tmp_path / "t3", None)
    assert other["tasks"][TASK]["h_eff"]["1"]["sampled"] != (
        report["tasks"][TASK]["h_eff"]["1"]["sampled"])


def test_lm_eval_cache_resume_regenerates_the_same_samples(sampled, snapshot_dir, tmp_path):
    import lm_eval

    from pipeline_lib.bench.runner import task_manager_for

    _, _, tasks_dir = sampled
    manager = task_manager_for([TASK], tasks_dir)

    def resps(limit: int | None, cache: Path | None) -> list[list[str]]:
        lm = LooplineLM(snapshot=str(snapshot_dir), h_eff=3, batch_size=4, seed=10_000)
        res = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=manager, limit=limit,
                                      log_samples=True, use_cache=str(cache) if cache else None)
        return [s["resps"][0] for s in sorted(res["samples"][TASK], key=lambda s: s["doc_id"])]

    whole = resps(None, None)
    assert all(len(five) == 5 for five in whole) and len({a for f in whole for a in f}) > 1
    cache = tmp_path / "cache" / "lm"
    assert resps(2, cache) == whole[:2]  # a run stopped after two questions…
    assert resps(None, cache) == whole  # …resumed from lm-eval's cache


def test_temperature_zero_repeats_are_todays_greedy(snapshot_dir, tmp_path):
    greedy = run_benchmarks(snapshot_dir, bench_config(sampling=BenchSamplingConfig()),
                            tmp_path / "g", None)
    zero = run_benchmarks(snapshot_dir, bench_config(sampling=BenchSamplingConfig(
        repeats=5, temperature=0.0)), tmp_path / "z", None)
    for h in ("1", "3"):
        g, z = greedy["tasks"][TASK]["h_eff"][h], zero["tasks"][TASK]["h_eff"][h]
        assert "sampled" not in g and z["per_sample"] == g["per_sample"]
        for label in ("maj@5", "pass@5"):
            assert z["sampled"][label]["per_sample"] == g["per_sample"]
        assert z["loops_per_answer"] == g["loops_per_answer"]  # every repeat the same answer


def test_summary_table_and_heatmap_show_sampled_scores(sampled, tmp_path):
    report, out_json, _ = sampled
    rows = summarize_bench([out_json], tmp_path / "s.parquet", tmp_path / "s.png")
    maj = [r for r in rows if r["metric"] == "maj@5"]
    assert {(r["h_eff"], r["level"]) for r in maj} == {(h, lv) for h in (1, 3)
                                                       for lv in (None, 1, 2)}
    for r in maj:
        entry = report["tasks"][TASK]["h_eff"][str(r["h_eff"])]["sampled"]["maj@5"]
        cell = entry if r["level"] is None else entry["levels"][str(r["level"])]
        assert (r["value"], r["n"], r["ci_low"], r["ci_high"]) == (
            cell.get("value", cell.get("maj@5")), cell["n"], cell["ci_low"], cell["ci_high"])
        assert r["samples"] == 5 and r["loops_per_answer"] == entry["loops_per_answer"]
        assert r["diff_vs_h1"] is None
    own = [r for r in rows if r["metric"] == "exact_match" and r["level"] is None]
    assert all(r["samples"] == 1 for r in own)
    from pipeline_lib.bench.scoring import bench_metrics
    from pipeline_lib.tracking.commit import check_metric_key

    metrics = bench_metrics(report)
    assert metrics[f"bench/{TASK}/maj_at_5_h3_k2"] == maj[-1]["value"]  # MLflow takes no @
    for key in metrics:
        check_metric_key(key)
    from pipeline_lib.bench.heatmap import plot_bench

    titles = [ax.get_title() for ax in plot_bench([report], tmp_path / "h.png").axes]
    assert [t.split("\n")[1].split(" at ")[0] for t in titles if t.startswith(TASK)] == [
        "exact_match", "maj@5", "pass@1", "pass@5"]
    assert "5 sampled answer(s) per question" in titles[1]


def test_user_tasks_with_lm_eval_filters_report_each_filter(snapshot_dir, tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    rows = [{"prompt": p, "answer": "9", "level": lv} for p, lv in
            (("5678", 1), ("45678", 1), ("678", 2), ("78", 2))]  # the model answers 9 greedily
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "vote.yaml").write_text(yaml.safe_dump({
        "task": "my_vote", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "rows.jsonl"}}, "test_split": "test",
        "output_type": "generate_until", "doc_to_text": "prompt", "doc_to_target": "answer",
        "target_delimiter": "", "repeats": 5,
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 4, "do_sample": True,
                              "temperature": 0.7},
        "filter_list": [{"name": "first", "filter": [{"function": "take_first"}]},
                        {"name": "maj@5", "filter": [{"function": "majority_vote"},
                                                     {"function": "take_first"}]}],
        "metric_list": [{"metric": "exact_match"}]}, sort_keys=False))
    bench = BenchConfig(tasks=[], include_path=str(root), h_eff=[2], batch_size=4)
    report = run_benchmarks(snapshot_dir, bench, tmp_path / "tasks", None)
    info = report["tasks"]["my_vote"]
    entry = info["h_eff"]["2"]["sampled"]["exact_match/maj@5"]
    assert list(info["h_eff"]["2"]["sampled"]) == ["exact_match/maj@5"]
    assert entry["samples"] == 5 and entry["n"] == 4 and entry["value"] > 0
    assert entry["loops_per_answer"] == 5 * info["h_eff"]["2"]["loops_per_answer"]
    assert info["h_eff"]["2"]["overall"]["exact_match/maj@5"] == entry["value"]
    assert sorted(entry["levels"]) == ["1", "2"]
