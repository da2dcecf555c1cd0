"""Cross-variant comparison from each run's H_eff table, final bench JSON and training log."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline_lib.compare import compare_runs
from pipeline_lib.errors import DataError
from pipeline_lib.evaluate.heff import sweep_result
from pipeline_lib.evaluate.heff_summary import summarize_heff
from pipeline_lib.evaluate.stats import wilson_interval


def _run(root: Path, name: str, losses: dict[int, float], acc: dict[str, float]) -> dict:
    run = root / name
    (run / "eval").mkdir(parents=True)
    sweep = run / "sweep.json"
    sweep.write_text(json.dumps(sweep_result(20, losses, 100)))
    summarize_heff([sweep], run / "eval" / "heff.parquet", run / "eval" / "heff.png")
    bench = {"step": 20, "tasks": {"loopline_khop": {"metric": "acc", "h_eff": {
        h: {"overall": {"acc": v, "acc_stderr": 0.1}} for h, v in acc.items()}}}}
    (run / "bench.json").write_text(json.dumps(bench))
    lines = [{"step": s, "loss": 3.0 - 0.1 * s, "skipped": s == 19} for s in range(1, 21)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"heff": run / "eval" / "heff.parquet", "bench": run / "bench.json",
            "metrics": run / "metrics.jsonl"}


def test_table_summary_and_plots(tmp_path: Path):
    inputs = {"shallow": _run(tmp_path, "shallow", {1: 2.0, 4: 2.1}, {"1": 0.5, "4": 0.4}),
              "deep": _run(tmp_path, "deep", {1: 2.2, 4: 1.8}, {"1": 0.5, "4": 0.7})}
    rows = compare_runs(inputs, tmp_path / "compare")
    table = pq.read_table(tmp_path / "compare" / "summary.parquet").to_pylist()
    assert table == rows
    val = {(r["run"], r["h_eff"]): r["value"] for r in rows if r["metric"] == "val/loss"}
    assert val == {("shallow", 1): 2.0, ("shallow", 4): 2.1, ("deep", 1): 2.2, ("deep", 4): 1.8}
    train = {r["run"]: r["value"] for r in rows if r["metric"] == "train/loss"}
    # mean of the last 10 non-skipped steps (10..20 without 19)
    expected = sum(3.0 - 0.1 * s for s in (10, 11, 12, 13, 14, 15, 16, 17, 18, 20)) / 10
    assert train["deep"] == pytest.approx(expected)
    md = (tmp_path / "compare" / "summary.md").read_text()
    assert "| deep | 20 |" in md and "H_eff=1: shallow, H_eff=4: deep" in md
    assert "**shallow**: best validation loss at H_eff=1; more loops at test time do not always" \
        in md
    for name in ("loss_vs_heff.png", "accuracy_vs_heff.png", "train_loss.png"):
        assert (tmp_path / "compare" / name).stat().st_size > 0


def test_missing_bench_json_is_named(tmp_path: Path):
    inputs = {"a": _run(tmp_path, "a", {1: 2.0}, {"1": 0.5})}
    inputs["a"]["bench"] = tmp_path / "nope.json"
    with pytest.raises(DataError, match="nope.json"):
        compare_runs(inputs, tmp_path / "compare")


def _bench_with_samples(at: dict[int, list[float]], levels: list[int]) -> dict:
    """A bench JSON as run_benchmarks writes it, from per-example scores at each H_eff."""
    from pipeline_lib.bench.scoring import add_paired_comparisons, sample_levels, task_scores

    def samples(scores):
        return [{"doc_id": i, "doc": {"level": lv}, "filter": "none", "acc": acc}
                for i, (acc, lv) in enumerate(zip(scores, levels, strict=True))]

    info = {"builtin": True, "metric": "acc", "h_eff": {},
            "sample_levels": sample_levels(samples(at[1]))}
    for h, scores in at.items():
        results = {"results": {"loopline_khop": {"acc,none": sum(scores) / len(scores)}},
                   "samples": {"loopline_khop": samples(scores)}}
        info["h_eff"][str(h)] = task_scores(results, "loopline_khop", "acc")
    add_paired_comparisons(info)
    return {"step": 20, "tasks": {"loopline_khop": info}}


def _variant(root: Path, name: str, core_layers: int, loops: int, deeper_gain: float,
             fixed: int) -> dict:
    """A run whose loss at H_eff=4 is ``deeper_gain`` nats/token lower on every document and
    which answers ``fixed`` more of the 40 level-2 examples right at H_eff=4."""
    import numpy as np

    from pipeline_lib.evaluate.heff_stats import DocumentLosses
    from pipeline_lib.spec.config import Config
    from pipeline_lib.spec.config_model import ModelConfig
    from pipeline_lib.spec.config_write import save_config

    run = root / name
    (run / "eval").mkdir(parents=True)
    rng = np.random.default_rng(len(name))
    tokens = rng.integers(20, 60, 50)
    base = rng.normal(2.0, 0.3, 50) * tokens
    docs = DocumentLosses([1, 4], np.stack([base, base - deeper_gain * tokens], axis=1), tokens)
    sweep = run / "sweep.json"
    sweep.write_text(json.dumps(sweep_result(20, docs.means(), docs.total_tokens, docs)))
    summarize_heff([sweep], run / "eval" / "heff.parquet", run / "eval" / "heff.png")
    levels = [1] * 40 + [2] * 40
    h1 = [1.0] * 30 + [0.0] * 10 + [1.0] * 10 + [0.0] * 30
    h4 = h1[:50] + [1.0] * fixed + [0.0] * (30 - fixed)
    (run / "bench.json").write_text(json.dumps(_bench_with_samples({1: h1, 4: h4}, levels)))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 20, "loss": 2.0}) + "\n")
    save_config(Config(model=ModelConfig(vocab_size=64, d_model=32, n_heads=2, prelude_layers=1,
                                         coda_layers=1, core_layers=core_layers, loops=loops)),
                run / "config.yaml")
    return {"heff": run / "eval" / "heff.parquet", "bench": run / "bench.json",
            "metrics": run / "metrics.jsonl", "config": run / "config.yaml"}


def test_intervals_sizes_and_paired_findings(tmp_path: Path):
    from pipeline_lib.spec.config_model import ModelConfig
    from pipeline_lib.spec.size import flops_per_token, param_count

    inputs = {"loop1": _variant(tmp_path, "loop1", 1, 1, 0.0, 0),
              "loop4": _variant(tmp_path, "loop4", 1, 4, 0.2, 20),
              "deep4": _variant(tmp_path, "deep4", 4, 1, 0.0, 1)}
    rows = compare_runs(inputs, tmp_path / "compare")
    assert pq.read_table(tmp_path / "compare" / "summary.parquet").to_pylist() == rows

    def row(run, metric, h=None, level=None):
        (match,) = [r for r in rows if (r["run"], r["metric"], r["h_eff"], r["level"]) ==
                    (run, metric, h, level)]
        return match

    cfg = {n: ModelConfig(vocab_size=64, d_model=32, n_heads=2, core_layers=c, loops=lp)
           for n, c, lp in (("loop4", 1, 4), ("deep4", 4, 1))}
    assert row("loop4", "model/params")["value"] == param_count(cfg["loop4"])
    assert row("deep4", "model/params")["value"] > row("loop4", "model/params")["value"]
    assert row("loop4", "model/flops_per_token")["value"] == flops_per_token(cfg["loop4"], 128) \
        == row("deep4", "model/flops_per_token")["value"]
    loss = row("loop4", "val/loss", 4)
    assert loss["n"] > 1000 and 0 < loss["stderr"] < 0.2
    acc = row("loop4", "loopline_khop/acc", 4, 2)
    assert acc["value"] == 0.75 and acc["n"] == 40
    assert (acc["ci_low"], acc["ci_high"]) == pytest.approx(wilson_interval(30, 40))
    assert row("loop4", "loopline_khop/acc", 1)["n"] == 80

    md = (tmp_path / "compare" / "summary.md").read_text()
    assert "| loop4 | 20 | " in md and "| deep4 | 20 | " in md  # variants table
    lo, hi = wilson_interval(30, 40)
    assert "| loop4 | 2 | 40 | 0.250 [" in md and f"0.750 [{lo:.2f}, {hi:.2f}] |" in md
    assert f"{loss['value']:.4f} ± {loss['stderr']:.4f}" in md
    findings = md.split("## Findings")[1]
    assert "loop4 · validation loss vs H_eff=1: deeper is better at H_eff=4 (-0.2000" in findings
    assert "loop1 · validation loss vs H_eff=1: no significant difference at H_eff=4" in findings
    assert "loop4 · loopline_khop/acc · level 2: deeper is better at H_eff=4 (+0.500" in findings
    assert "loop4 · loopline_khop/acc · level 1: no significant difference" in findings
    assert "deep4 · loopline_khop/acc · level 2: no significant difference at H_eff=4 (+0.025" \
        in findings


def test_verdict_directions():
    from pipeline_lib.compare import verdict

    assert verdict({"diff": 0.1, "lo": 0.02, "hi": 0.2}, higher_is_better=True) == \
        "deeper is better"
    assert verdict({"diff": 0.1, "lo": 0.02, "hi": 0.2}, higher_is_better=False) == \
        "deeper is worse"
    assert verdict({"diff": -0.1, "lo": -0.2, "hi": 0.0}, higher_is_better=False) == \
        "no significant difference"  # touching zero is not excluding it
    assert verdict(None, higher_is_better=True) == "no paired interval"


# --------------------------------------------------------------------------- depth check


def make_run_dir(results: Path, name: str, core_layers: int | None, loops: int,
                 at: dict[int, list[float]], levels: list[int], train_max: int | None = 2,
                 step: int = 20) -> Path:
    """A finished ``results/{name}`` directory as the workflow leaves it: snapshot index and
    config, H_eff table and plot, final bench JSON (per-example scores ``at`` H_eff, doc_id =
    position, ``levels`` per example) and heatmap, training log. ``core_layers`` None: the
    snapshot has no config (unknown kind)."""
    from pipeline_lib.spec.config import Config
    from pipeline_lib.spec.config_model import ModelConfig
    from pipeline_lib.spec.config_write import save_config

    run = results / name
    snap = run / "snapshots" / f"step_{step:07d}"
    for d in (snap, run / "eval", run / "bench", run / "train"):
        d.mkdir(parents=True)
    (run / "snapshots" / "index.json").write_text(json.dumps({"final_step": step}))
    if core_layers is not None:
        save_config(Config(model=ModelConfig(vocab_size=64, d_model=32, n_heads=2,
                                             core_layers=core_layers, loops=loops)),
                    snap / "config.yaml")
    sweep = run / "sweep.json"
    sweep.write_text(json.dumps(sweep_result(step, {1: 2.0, loops: 2.0 - 0.01 * loops}, 100)))
    summarize_heff([sweep], run / "eval" / "heff.parquet", run / "eval" / "heff.png")
    bench = _bench_with_samples(at, levels)
    bench["step"], bench["train_max_difficulty"] = step, train_max
    (run / "bench" / f"step_{step:07d}.json").write_text(json.dumps(bench))
    (run / "bench" / "accuracy_vs_heff.png").write_bytes(b"png of " + name.encode())
    (run / "train" / "metrics.jsonl").write_text(json.dumps({"step": step, "loss": 2.0}) + "\n")
    return run


LEVELS = [1] * 50 + [2] * 200 + [3] * 50  # level 3 lies beyond the training range (≤ 2)


def _answers(level1: int, level2: int, level3: int = 0) -> list[float]:
    """Correct on the first ``level1`` / ``level2`` / ``level3`` examples of each level."""
    return [float(i < k) for n, k in ((50, level1), (200, level2), (50, level3))
            for i in range(n)]


def depth_results(results: Path) -> dict[str, Path]:
    """Kinds from the config, not the names: alpha is 1 block × 4 loops, beta 1 × 1 and gamma
    4 × 1. At level 2 alpha answers 160 of 200 at H_eff=4 and 100 at H_eff=1; beta answers
    the same 100 and gamma the same 160; level 1 is identical everywhere."""
    return {
        "alpha": make_run_dir(results, "alpha", 1, 4, {1: _answers(30, 100), 4: _answers(30, 160, 10)},
                              LEVELS),
        "beta": make_run_dir(results, "beta", 1, 1, {1: _answers(30, 100), 4: _answers(30, 90)},
                             LEVELS),
        "gamma": make_run_dir(results, "gamma", 4, 1, {1: _answers(30, 160), 4: _answers(30, 150)},
                              LEVELS),
    }


def test_depth_check_compares_variants_on_the_same_examples(tmp_path: Path):
    from pipeline_lib.compare import run_dir_inputs

    dirs = depth_results(tmp_path / "results")
    compare_runs({n: run_dir_inputs(d) for n, d in dirs.items()}, tmp_path / "compare")
    check = json.loads((tmp_path / "compare" / "depth_check.json").read_text())
    assert check["kinds"] == {"alpha": "looped", "beta": "shallow", "gamma": "deep"}
    assert check["runs"] == ["alpha", "beta", "gamma"] and check["notes"] == []
    recs = {(c["level"], c["other"]): c for c in check["comparisons"]}
    assert set(recs) == {(lv, o) for lv in (1, 2) for o in ("alpha", "beta", "gamma")}
    assert {c["variant"] for c in check["comparisons"]} == {"alpha"}
    assert all((c["h_eff"], c["other_h_eff"]) == (4, 1) for c in check["comparisons"])
    for other, against in (("alpha", "own H_eff=1"), ("beta", "1 block × 1 loop")):
        rec = recs[(2, other)]  # 80% vs 50% of the same 200 examples
        assert rec["against"] == against and rec["n"] == 200
        assert rec["accuracy"] == 0.8 and rec["other_accuracy"] == 0.5
        assert rec["diff"] == pytest.approx(0.3) and 0 < rec["lo"] < 0.3 < rec["hi"]
        assert (rec["ci_low"], rec["ci_high"]) == pytest.approx(wilson_interval(160, 200))
        assert (rec["other_ci_low"], rec["other_ci_high"]) == \
            pytest.approx(wilson_interval(100, 200))
        assert rec["intervals_overlap"] is False and rec["verdict"] == "better"
        assert rec["p_mcnemar"] < 1e-10  # 60 discordant pairs, all one way
    same = recs[(2, "gamma")]  # identical answers
    assert same["against"] == "deep" and same["diff"] == same["lo"] == same["hi"] == 0.0
    assert same["intervals_overlap"] is True and same["verdict"] == "no significant difference"
    assert all(recs[(1, o)]["verdict"] == "no significant difference" for o in dirs)
    targets = {t["level"]: t for t in check["targets"]}
    assert targets[2] == {"variant": "alpha", "task": "loopline_khop/acc", "level": 2,
                          "hardest_in_range": True, "over_own_h1": True, "over_shallow": True,
                          "vs_deep": True, "met": True}
    assert targets[1]["met"] is False and targets[1]["over_own_h1"] is False

    md = (tmp_path / "compare" / "summary.md").read_text()
    depth = md.split("## Depth check")[1].split("## Findings")[0]
    lo, hi = wilson_interval(160, 200)
    assert (f"| loopline_khop/acc | 2 | 200 | 0.800 [{lo:.2f}, {hi:.2f}] | beta H_eff=1 "
            "(1 block × 1 loop) | 0.500 [") in depth
    assert "| no | better |" in depth and "| yes | no significant difference |" in depth
    assert "- loopline_khop/acc: target met at level 2; not met at level 1 (hardest in range: 2)." \
        in depth
    assert "| alpha | 3 (beyond) | 50 | 0.000 [" in md  # beyond-range rows stay in the tables


def test_depth_check_verdict_worse_and_unknown_kinds(tmp_path: Path):
    from pipeline_lib.compare import compare_examples, depth_check, load_runs, run_dir_inputs

    results = tmp_path / "results"
    dirs = {"loopy": make_run_dir(results, "loopy", 2, 3, {1: _answers(30, 40), 3: _answers(30, 40)},
                                  LEVELS, train_max=None),
            "strong": make_run_dir(results, "strong", 1, 1, {1: _answers(30, 120)}, LEVELS),
            "nocfg": make_run_dir(results, "nocfg", None, 1, {1: _answers(30, 120)}, LEVELS)}
    runs = load_runs({n: run_dir_inputs(d) for n, d in dirs.items()})
    rec = compare_examples(runs[0], 3, runs[1], 1, "loopline_khop/acc", 2)
    assert rec["diff"] == pytest.approx(-0.4) and rec["hi"] < 0 and rec["verdict"] == "worse"
    check = depth_check(runs)
    assert check["kinds"] == {"loopy": "looped", "strong": "shallow", "nocfg": None}
    # no train_max_difficulty: every level is checked (and said so); nocfg is never compared
    assert sorted({c["level"] for c in check["comparisons"]}) == [1, 2, 3]
    assert {c["other"] for c in check["comparisons"]} == {"loopy", "strong"}
    assert any("no train_max_difficulty" in note for note in check["notes"])
    assert {t["level"]: t["vs_deep"] for t in check["targets"]} == {1: None, 2: None, 3: None}


def test_depth_check_without_looped_variant():
    from pipeline_lib.compare import RunResults, depth_check, depth_markdown

    flat = RunResults("flat", 1, {1: 2.0}, {}, [], train_loops=1, core_layers=1)
    check = depth_check([flat])
    assert check["comparisons"] == [] and check["kinds"] == {"flat": "shallow"}
    assert "- no looped variant (model.loops > 1) among the runs" in depth_markdown(check)


def test_accuracy_against_compute_spent_per_variant_and_depth_setting(tmp_path: Path):
    from collections import Counter

    from pipeline_lib.bench.loops_used import loops_summary
    from pipeline_lib.bench.scoring import task_scores

    inputs = {"loop1": _variant(tmp_path, "loop1", 1, 1, 0.0, 0),
              "loop4": _variant(tmp_path, "loop4", 1, 4, 0.2, 20)}
    bench = json.loads(inputs["loop4"]["bench"].read_text())
    info = bench["tasks"]["loopline_khop"]
    levels = [1] * 40 + [2] * 40
    scores = [1.0] * 30 + [0.0] * 10 + [1.0] * 25 + [0.0] * 15  # 55 of 80 right
    samples = [{"doc_id": i, "doc": {"level": lv}, "filter": "none", "acc": acc}
               for i, (acc, lv) in enumerate(zip(scores, levels, strict=True))]
    entry = task_scores({"results": {"loopline_khop": {"acc,none": 55 / 80}},
                         "samples": {"loopline_khop": samples}}, "loopline_khop", "acc")
    # level 1: 3 tokens per example, two exit after 1 loop (mean 2); level 2: all use 4.
    # Level 1's tokens were generated (computed = used), level 2's scored (computed = 4)
    docs = {i: Counter({1: 2, 4: 1}) if lv == 1 else Counter({4: 3})
            for i, lv in enumerate(levels)}
    generated = {i: c for i, c in docs.items() if levels[i] == 1}
    entry["loops"] = loops_summary(docs, 4, info["sample_levels"], generated=generated)
    entry.update(kv_bytes=9000, kv_bytes_core=6000)
    info["h_eff"]["4"].update(kv_bytes=12000, kv_bytes_core=9000)
    info["adaptive"] = {"adaptive:0.01:4": entry}
    bench["bench"] = {"adaptive_criterion": "kl"}
    bench["setting_seconds"] = {"1": 1.5, "4": 4.25, "adaptive:0.01:4": 3.0}
    inputs["loop4"]["bench"].write_text(json.dumps(bench))
    out = tmp_path / "compare"
    rows = compare_runs(inputs, out)
    md = (out / "summary.md").read_text()
    assert "## Accuracy against compute spent" in md
    lo, hi = wilson_interval(55, 80)
    assert (f"| loop4 | loopline_khop/acc | adaptive:0.01:4 (kl) | 3.00 | 3.00 | "
            f"{55 / 80:.3f} [{lo:.2f}, {hi:.2f}] | 9kB (6kB) | 3.0 |") in md
    lo, hi = wilson_interval(60, 80)
    assert (f"| loop4 | loopline_khop/acc | H_eff=4 | 4.00 | 4.00 | 0.750 [{lo:.2f}, {hi:.2f}] "
            "| 12kB (9kB) | 4.2 |") in md
    assert "| loop1 | loopline_khop/acc | H_eff=1 | 1.00 | 1.00 | 0.500" in md
    table = md.split("## Accuracy against compute spent")[1].split("\n## ")[0]
    loop1 = [line for line in table.splitlines() if line.startswith("| loop1 |")]
    assert loop1 and all(line.endswith("| – | – |") for line in loop1)  # nothing recorded
    assert "| loop4 | loopline_khop/acc | H_eff=1 | 1.00 | 1.00 |" in table

    def value(metric, level=None, h=4):
        (match,) = [r["value"] for r in rows if (r["run"], r["metric"], r["h_eff"], r["level"])
                    == ("loop4", metric, h, level)]
        return match

    assert value("loopline_khop/mean_loops_adaptive:0.01:4") == 3.0
    assert value("loopline_khop/mean_loops_adaptive:0.01:4", 1) == 2.0
    assert value("loopline_khop/mean_loops_adaptive:0.01:4", 2) == 4.0
    assert value("loopline_khop/computed_loops_adaptive:0.01:4", 1) == 2.0
    assert value("loopline_khop/acc_adaptive:0.01:4") == 55 / 80
    assert value("loopline_khop/acc_adaptive:0.01:4", 2) == 25 / 40
    assert value("loopline_khop/acc") == 0.75  # the fixed H_eff=4 row is unchanged
    assert value("loopline_khop/kv_bytes") == 12000
    assert value("loopline_khop/kv_bytes_core_adaptive:0.01:4") == 6000
    assert value("bench/seconds", h=1) == 1.5
    assert value("bench/seconds_adaptive:0.01:4") == 3.0
    assert (out / "accuracy_vs_loops.png").stat().st_size > 0
    compare_runs({"loop1": inputs["loop1"]}, out)  # no adaptive results: no table, no plot
    assert "loops computed" not in (out / "summary.md").read_text()
    assert not (out / "accuracy_vs_loops.png").exists()


def test_a_bench_json_without_loops_computed_still_compares(tmp_path: Path):
    """Written before compute spent was recorded: loops used only, '–' for the rest."""
    from collections import Counter

    from pipeline_lib.bench.loops_used import loops_summary

    inputs = {"loop4": _variant(tmp_path, "loop4", 1, 4, 0.2, 20)}
    bench = json.loads(inputs["loop4"]["bench"].read_text())
    info = bench["tasks"]["loopline_khop"]
    entry = dict(info["h_eff"]["4"])
    entry["loops"] = loops_summary({0: Counter({2: 3})}, 4)
    info["adaptive"] = {"adaptive:0.01:4": entry}
    inputs["loop4"]["bench"].write_text(json.dumps(bench))
    compare_runs(inputs, tmp_path / "compare")
    md = (tmp_path / "compare" / "summary.md").read_text()
    assert "| loop4 | loopline_khop/acc | adaptive:0.01:4 | 2.00 | – | 0.750" in md


def test_runs_without_downstream_benchmarks_compare_on_loss(tmp_path: Path):
    """bench.tasks: [] (no include_path): the bench JSON has no tasks; loss still compares."""
    inputs = {"loop1": _variant(tmp_path, "loop1", 1, 1, 0.0, 0),
              "loop4": _variant(tmp_path, "loop4", 1, 4, 0.2, 20)}
    for files in inputs.values():
        bench = json.loads(files["bench"].read_text())
        files["bench"].write_text(json.dumps({**bench, "tasks": {}}))
    rows = compare_runs(inputs, tmp_path / "compare")
    assert not [r for r in rows if r["metric"].startswith(("loopline_", "bench/"))]
    val = {(r["run"], r["h_eff"]): r["value"] for r in rows if r["metric"] == "val/loss"}
    assert val[("loop4", 4)] == pytest.approx(val[("loop4", 1)] - 0.2)
    md = (tmp_path / "compare" / "summary.md").read_text()
    assert "loopline_khop" not in md and "deeper is better at H_eff=4" in md
    assert json.loads((tmp_path / "compare" / "depth_check.json").read_text())[
        "comparisons"] == []
    for name in ("loss_vs_heff.png", "accuracy_vs_heff.png", "train_loss.png"):
        assert (tmp_path / "compare" / name).stat().st_size > 0
