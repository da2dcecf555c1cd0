"""Per-token depth in the benchmarks: loops used under adaptive exit, per task and level, in
the bench JSON, the summary table and the stage's MLflow metrics.

Token counts are recomputed here without the wrapper's counter: a multiple-choice question
scores every byte of every choice (byte tokenizer, empty target delimiter); a generation
takes one step per kept token, plus one for the EOS that ends it early.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pyarrow.parquet as pq
import pytest
from snapshot_helpers import greedy_reference

from pipeline_lib.bench.lm_requests import cut_at_stops
from pipeline_lib.bench.loops_used import LoopsUsed, loops_summary
from pipeline_lib.bench.runner import adaptive_settings, run_benchmarks
from pipeline_lib.bench.scoring import SUMMARY_COLUMNS, bench_metrics, summarize_bench
from pipeline_lib.bench.tasks import GENERATION_STOPS
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import AdaptiveExitConfig, BenchConfig, Config
from pipeline_lib.spec.rules import validate_config
from pipeline_lib.tracking.commit import check_metric_key

pytestmark = pytest.mark.slow
NEVER, EARLY = "adaptive:0:3", "adaptive:0.01:3"


@pytest.fixture(scope="module")
def adaptive_report(tmp_path_factory, snapshot_dir, small_bench):
    """(report, tasks dir) at H_eff 1, 3 and adaptive exit 0 (never early) and 0.01, MAX 3."""
    out = tmp_path_factory.mktemp("bench_adaptive")
    bench = replace(small_bench, adaptive=AdaptiveExitConfig(thresholds=[0.01, 0.0]))
    report = run_benchmarks(snapshot_dir, bench, out / "tasks", out / "step_0000007.json")
    return report, out / "tasks"


def _rows(tasks_dir, name):
    return [json.loads(line) for line in (tasks_dir / f"{name}.jsonl").read_text().splitlines()]


def generated_tokens(model, tokenizer, prompt: str, h_eff: int, max_gen: int) -> int:
    """Decoding steps of one greedy generation: up to the token that completes a stop
    string, else up to and including EOS, else the whole budget."""
    eos = tokenizer.token_to_id("<|endoftext|>")
    ids = greedy_reference(model, tokenizer.encode(prompt).ids, h_eff, max_gen, eos)
    for k in range(1, len(ids) + 1):
        if cut_at_stops(tokenizer.decode(ids[:k]), GENERATION_STOPS)[1]:
            return k
    return len(ids) + 1 if len(ids) < max_gen else max_gen


def scored_tokens(info, rows, model, tokenizer, max_gen: int) -> dict[str, int]:
    """{level: tokens} a task scores (multiple choice) or generates at H_eff 3."""
    out: Counter[str] = Counter()
    for row in rows:
        if info["output_type"] == "multiple_choice":
            n = sum(len(tokenizer.encode(c).ids) for c in row["choices"])
        else:
            n = generated_tokens(model, tokenizer, row["prompt"], 3, max_gen)
        out[str(row["level"])] += n
    return dict(out)


def test_loops_used_histograms_count_every_token_per_task_and_level(
        adaptive_report, small_bench, trained_model, tokenizer):
    report, tasks_dir = adaptive_report
    assert report["adaptive"] == [NEVER, EARLY]
    assert report["bench"]["adaptive_thresholds"] == [0.01, 0.0]
    for name, info in report["tasks"].items():
        assert sorted(info["adaptive"]) == [EARLY, NEVER]
        want = scored_tokens(info, _rows(tasks_dir, name), trained_model, tokenizer,
                             small_bench.max_gen_toks)
        never = info["adaptive"][NEVER]["loops"]
        # threshold 0 never exits early: every token used all 3 loops
        assert never["mean"] == 3.0 and never["max_loops"] == 3
        assert never["hist"] == {"1": 0, "2": 0, "3": sum(want.values())}
        assert never["tokens"] == sum(want.values())
        assert {lv: e["hist"]["3"] for lv, e in never["levels"].items()} == want
        assert all(e["mean"] == 3.0 for e in never["levels"].values())
        early = info["adaptive"][EARLY]["loops"]
        assert sorted(early["hist"]) == ["1", "2", "3"]
        assert sum(early["hist"].values()) == early["tokens"]
        assert early["mean"] == pytest.approx(
            sum(int(t) * n for t, n in early["hist"].items()) / early["tokens"])
        assert early["tokens"] == sum(e["tokens"] for e in early["levels"].values())
        for lv, entry in early["levels"].items():
            assert sum(entry["hist"].values()) == entry["tokens"]
            if info["output_type"] == "multiple_choice":  # same tokens at every depth
                assert entry["tokens"] == want[lv]
    assert any(e["loops"]["mean"] < 3.0 for info in report["tasks"].values()
               for e in info["adaptive"].values())  # the trained model does exit early


def test_compute_spent_per_task_and_setting(adaptive_report):
    """Loops computed: a scored token MAX whatever its exit, a generated token its own
    loops; KV bytes only where a task generates; wall time per setting."""
    report, _ = adaptive_report
    assert sorted(report["setting_seconds"]) == sorted(["1", "3", NEVER, EARLY])
    assert all(s > 0 for s in report["setting_seconds"].values())
    for info in report["tasks"].values():
        generates = info["output_type"] == "generate_until"
        for entry in info["adaptive"].values():
            loops = entry["loops"]
            if generates:  # decoded through the cache: used = computed
                assert loops["generated_tokens"] == loops["tokens"] > 0
                assert loops["computed_mean"] == pytest.approx(loops["mean"])
            else:  # a scoring pass computes every loop at every position
                assert loops["generated_tokens"] == 0 and loops["computed_mean"] == 3.0
            for lv, cell in loops["levels"].items():
                assert cell["generated_tokens"] == (cell["tokens"] if generates else 0), lv
        for entry in [*info["h_eff"].values(), *info["adaptive"].values()]:
            if generates:
                assert entry["kv_bytes"] > entry["kv_bytes_core"] > 0
            else:
                assert "kv_bytes" not in entry and "kv_bytes_core" not in entry
        if generates:  # the prelude and coda slots do not depend on the loop count
            cells = info["h_eff"]
            assert cells["3"]["kv_bytes_core"] == 3 * cells["1"]["kv_bytes_core"]
            assert info["adaptive"][NEVER]["kv_bytes"] == cells["3"]["kv_bytes"]
    scored = [info["adaptive"][EARLY]["loops"] for info in report["tasks"].values()
              if info["output_type"] != "generate_until"]
    assert any(e["mean"] < e["computed_mean"] == 3.0 for e in scored)  # needs less, spends all


def test_adaptive_scores_sit_beside_unchanged_fixed_ones(adaptive_report, bench_report):
    report, _ = adaptive_report
    fixed, _, _ = bench_report
    assert "adaptive" not in fixed and all("adaptive" not in i for i in fixed["tasks"].values())
    for name, info in report["tasks"].items():
        assert info["h_eff"] == fixed["tasks"][name]["h_eff"]  # no loops keys, same numbers
        assert info["paired"] == fixed["tasks"][name]["paired"]
        never = info["adaptive"][NEVER]
        assert never["per_sample"] == info["h_eff"]["3"]["per_sample"]  # = fixed H_eff=MAX
        assert never["levels"] == info["h_eff"]["3"]["levels"]


def test_compare_sets_a_real_bench_json_against_compute_spent(adaptive_report, tmp_path):
    """The bench stage's own JSON through compare's table: a row per setting with loops used
    and computed, the KV cache and wall time (the figure: tests/test_compare.py)."""
    import pyarrow as pa

    from pipeline_lib.compare import comparison_rows, load_run_results, summary_markdown

    report, _ = adaptive_report
    pq.write_table(pa.table({"step": [7, 7], "h_eff": [1, 3], "loss": [2.0, 1.9]}),
                   tmp_path / "heff.parquet")
    (tmp_path / "bench.json").write_text(json.dumps(report))
    run = load_run_results("tiny", tmp_path / "heff.parquet", tmp_path / "bench.json",
                           tmp_path / "metrics.jsonl", tmp_path / "no_config.yaml")
    rows = comparison_rows([run])
    early = report["tasks"]["loopline_addition"]["adaptive"][EARLY]
    (kv,) = [r["value"] for r in rows if r["metric"] == f"loopline_addition/kv_bytes_{EARLY}"]
    assert kv == early["kv_bytes"]
    (computed,) = [r["value"] for r in rows if r["level"] is None and r["metric"]
                   == f"loopline_khop/computed_loops_{EARLY}"]
    assert computed == 3.0
    (wall,) = [r["value"] for r in rows if r["metric"] == f"bench/seconds_{EARLY}"]
    assert wall == report["setting_seconds"][EARLY]
    loops = early["loops"]
    assert (f"| tiny | loopline_addition/exact_match | {EARLY} (kl) | {loops['mean']:.2f} | "
            f"{loops['computed_mean']:.2f} |") in summary_markdown([run])


def test_summary_table_and_metrics_carry_mean_loops(adaptive_report, tmp_path):
    report, _ = adaptive_report
    path = tmp_path / "step_0000007.json"
    path.write_text(json.dumps(report))
    rows = summarize_bench([path], tmp_path / "s.parquet", tmp_path / "s.png")
    table = pq.read_table(tmp_path / "s.parquet")
    assert tuple(table.column_names) == SUMMARY_COLUMNS and table.to_pylist() == rows
    fixed = [r for r in rows if r["adaptive"] is None]
    assert fixed and all(r["mean_loops"] is None and r["loops_hist"] is None for r in fixed)
    khop = report["tasks"]["loopline_khop"]["adaptive"][EARLY]
    (whole,) = [r for r in rows if (r["task"], r["adaptive"], r["level"], r["metric"])
                == ("loopline_khop", EARLY, None, "acc")]
    assert whole["h_eff"] == 3 and whole["value"] == khop["overall"]["acc"]
    assert whole["mean_loops"] == khop["loops"]["mean"]
    assert json.loads(whole["loops_hist"]) == khop["loops"]["hist"]
    assert whole["diff_vs_h1"] is None  # paired differences are fixed H_eff against H_eff
    (hard,) = [r for r in rows if (r["task"], r["adaptive"], r["level"], r["metric"])
               == ("loopline_khop", EARLY, 3, "acc")]
    assert hard["mean_loops"] == khop["loops"]["levels"]["3"]["mean"]
    metrics = bench_metrics(report)
    for key in metrics:
        check_metric_key(key)
    assert metrics[f"bench/loopline_khop/acc_{EARLY}"] == khop["overall"]["acc"]
    assert metrics[f"bench/loopline_khop/mean_loops_{EARLY}_k3"] == hard["mean_loops"]
    assert metrics[f"bench/loopline_khop/loops_hist_{EARLY}/2"] == khop["loops"]["hist"]["2"]
    assert metrics["bench/loopline_khop/acc_h3"] == \
        report["tasks"]["loopline_khop"]["h_eff"]["3"]["overall"]["acc"]  # not overwritten
    # compute spent: loops computed, the KV cache where a task generates, wall time
    assert whole["computed_loops"] == khop["loops"]["computed_mean"] == 3.0
    assert whole["kv_bytes"] is None
    assert whole["setting_seconds"] == report["setting_seconds"][EARLY]
    addition = report["tasks"]["loopline_addition"]
    (gen,) = [r for r in rows if (r["task"], r["adaptive"], r["level"], r["h_eff"], r["metric"])
              == ("loopline_addition", None, None, 3, "exact_match")]
    assert (gen["kv_bytes"], gen["kv_bytes_core"]) == (addition["h_eff"]["3"]["kv_bytes"],
                                                       addition["h_eff"]["3"]["kv_bytes_core"])
    assert metrics["bench/loopline_addition/kv_bytes_core_h3"] == gen["kv_bytes_core"]
    assert metrics[f"bench/loopline_khop/computed_loops_{EARLY}"] == 3.0
    assert metrics["bench/seconds_h1"] == report["setting_seconds"]["1"]
    assert "bench/loopline_khop/kv_bytes_h1" not in metrics


def test_loops_summary_and_counter():
    used = LoopsUsed()
    used.add("t", 0, [1, 3, 3])
    used.add("t", 1, [2])
    used.add("t", 0, [3])
    used.add(None, None, [4])
    assert used.tasks() == ["t", "unknown"]
    assert used.mean_per_task() == {"t": 12 / 5, "unknown": 4.0}
    summary = loops_summary(used.documents("t"), 4, {"0": 1, "1": 2})
    assert summary == {"mean": 12 / 5, "tokens": 5, "max_loops": 4,
                       "hist": {"1": 1, "2": 1, "3": 3, "4": 0},
                       "levels": {"1": {"mean": 2.5, "tokens": 4,
                                        "hist": {"1": 1, "2": 0, "3": 3, "4": 0}},
                                  "2": {"mean": 2.0, "tokens": 1,
                                        "hist": {"1": 0, "2": 1, "3": 0, "4": 0}}}}
    assert "levels" not in loops_summary(used.documents("t"), 4)
    used.add("t", 1, [2, 4], generated=True)  # doc 1: a scored 2, generated 2 and 4
    summary = loops_summary(used.documents("t"), 4, {"0": 1, "1": 2},
                            generated=used.documents("t", generated=True))
    # 4 scored tokens of doc 0 and one of doc 1 computed 4 loops each, the generated 2 + 4
    assert (summary["generated_tokens"], summary["computed_mean"]) == (2, (5 * 4 + 6) / 7)
    assert summary["levels"]["1"]["generated_tokens"] == 0
    assert summary["levels"]["1"]["computed_mean"] == 4.0
    assert summary["levels"]["2"] == {"mean": 8 / 3, "tokens": 3, "generated_tokens": 2,
                                      "computed_mean": 10 / 3,
                                      "hist": {"1": 0, "2": 2, "3": 0, "4": 1}}
    assert used.cache_bytes("t") == {}
    used.add_cache(["t", "u", None], 100, 60)
    used.add_cache(["t"], 80, 70)
    assert used.cache_bytes("t") == {"kv_bytes": 100, "kv_bytes_core": 70}
    assert used.cache_bytes("unknown") == {"kv_bytes": 100, "kv_bytes_core": 60}
    used.clear()
    assert used.mean_per_task() == {} and used.documents("t") == {}
    assert used.cache_bytes("t") == {}


def test_adaptive_settings_from_the_bench_config():
    adaptive = AdaptiveExitConfig(thresholds=[0.01, 0.0, 0.01, 1e-3])
    bench = BenchConfig(h_eff=[1, 4, 8], adaptive=adaptive)
    assert adaptive_settings(bench, bench.h_eff) == [
        "adaptive:0:8", "adaptive:0.001:8", "adaptive:0.01:8"]
    assert adaptive_settings(replace(bench, adaptive=replace(adaptive, max_loops=12)), [2]) == [
        "adaptive:0:12", "adaptive:0.001:12", "adaptive:0.01:12"]
    assert adaptive_settings(BenchConfig(), [1, 4]) == []
    cfg = Config()
    cfg.bench.adaptive.thresholds = [0.01, float("nan")]
    with pytest.raises(ConfigError, match=r"bench\.adaptive\.thresholds"):
        validate_config(cfg)


def test_adaptive_settings_of_several_criteria_name_all_but_the_first():
    """bench.adaptive takes the keys of eval.adaptive: every criterion, its own thresholds;
    the first criterion is the lm-eval model's default and goes unnamed."""
    adaptive = AdaptiveExitConfig(criteria=["entropy", "argmax_stable"], thresholds=[0.5],
                                  criterion_thresholds={"argmax_stable": [2, 0]})
    assert adaptive_settings(BenchConfig(adaptive=adaptive), [1, 3]) == [
        "adaptive:0.5:3", "adaptive:argmax_stable:0:3", "adaptive:argmax_stable:2:3"]
    cfg = Config()
    cfg.bench.adaptive = AdaptiveExitConfig(criteria=["argmax_stable"], thresholds=[0.5])
    with pytest.raises(ConfigError, match=r"bench\.adaptive\.thresholds \(argmax_stable\) = "
                                          r"0\.5: argmax_stable takes a whole number"):
        validate_config(cfg)


def test_bench_and_eval_share_one_adaptive_section():
    """Both sections name their adaptive exit with one dataclass (one set of keys), so a
    criterion or key added to one is added to both."""
    from dataclasses import fields

    from pipeline_lib.evaluate.exit.spec import CRITERIA
    from pipeline_lib.spec.config import EvalConfig

    def field_type(cls):
        (f,) = [f for f in fields(cls) if f.name == "adaptive"]
        return type(f.default_factory())

    assert field_type(BenchConfig) is field_type(EvalConfig) is AdaptiveExitConfig
    (criteria,) = [f for f in fields(AdaptiveExitConfig) if f.name == "criteria"]
    assert sorted(criteria.metadata["items"]["choices"]) == sorted(CRITERIA)
