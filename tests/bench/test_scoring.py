"""Scores from lm-eval results and the summary table + heatmap figure."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest

from pipeline_lib.bench.heatmap import _cell_label, _level_label
from pipeline_lib.bench.scoring import (
    SUMMARY_COLUMNS,
    add_paired_comparisons,
    bench_records,
    level_scores,
    overall_metrics,
    per_sample_metric,
    sample_levels,
    summarize_bench,
    task_scores,
)
from pipeline_lib.errors import DataError
from pipeline_lib.evaluate.stats import wilson_interval


def _ci(k: int, n: int) -> dict[str, float]:
    lo, hi = wilson_interval(k, n)
    return {"ci_low": lo, "ci_high": hi}


def test_level_scores_and_overall_metrics():
    samples = [{"doc": {"level": lv}, "filter": "none", "acc": acc}
               for lv, acc in [(1, 1.0), (1, 0.0), (1, 1.0), (5, 0.0), (5, 1.0)]]
    samples.append({"doc": {"level": 5}, "filter": "strict", "acc": 1.0})  # other filter: skipped
    assert level_scores(samples, "acc") == {
        "1": {"acc": 2 / 3, "n": 3, **_ci(2, 3)}, "5": {"acc": 0.5, "n": 2, **_ci(1, 2)}}
    results = {"alias": "t", "name": "t", "sample_len": 5, "acc,none": 0.6,
               "acc_stderr,none": "N/A", "exact_match,strict-match": 0.25}
    assert overall_metrics(results) == {"acc": 0.6, "exact_match/strict-match": 0.25}


def test_level_scores_by_another_field_and_the_first_filter():
    samples = [{"doc": {"hops": lv, "level": 9}, "filter": "strict-match", "exact_match": em}
               for lv, em in [(2, 1.0), ("2", 0.0), (3.0, 1.0), (None, 0.0)]]
    samples.append({"doc": {"hops": 3}, "filter": "flexible", "exact_match": 0.0})
    assert level_scores(samples, "exact_match", level_field="hops") == {
        "2": {"exact_match": 0.5, "n": 2, **_ci(1, 2)},
        "3": {"exact_match": 1.0, "n": 1, **_ci(1, 1)}}
    with pytest.raises(DataError, match=r"field 'hops' = 'hard' is not an integer level; set "
                                        r"bench\.level_field"):
        level_scores([{"doc": {"hops": "hard"}, "acc": 1.0}], "acc", level_field="hops")


@pytest.mark.parametrize(("output_type", "metric_list", "sample", "expected"), [
    ("multiple_choice", [{"metric": "acc_norm"}, {"metric": "acc"}], {"acc": 1, "acc_norm": 0},
     "acc"),
    ("generate_until", [{"metric": "exact_match"}], {"exact_match": 0.0}, "exact_match"),
    ("multiple_choice", [{"metric": "acc_norm"}], {"acc_norm": 1.0}, "acc_norm"),
    ("generate_until", [{"metric": "bleu"}, {"metric": "f1"}], {"bleu": ["a", "b"], "f1": 0.5},
     "f1"),
    ("loglikelihood_rolling", [{"metric": "bits_per_byte"}], {"bits_per_byte": [1.0, 3]}, None),
])
def test_per_sample_metric(output_type, metric_list, sample, expected):
    results = {"configs": {"t": {"output_type": output_type, "metric_list": metric_list}},
               "samples": {"t": [{"doc": {}, **sample}] * 2}}
    assert per_sample_metric(results, "t") == expected


@pytest.mark.slow
def test_summary_table_and_figure(bench_report, tmp_path):
    import matplotlib.image

    report, out_json, _ = bench_report
    later = copy.deepcopy(report)
    later["step"] = 14
    later["tasks"]["loopline_khop"]["h_eff"]["3"]["levels"]["2"]["acc"] = 0.125
    later_json = tmp_path / "step_0000014.json"
    later_json.write_text(json.dumps(later))
    rows = summarize_bench([later_json, out_json], tmp_path / "s.parquet", tmp_path / "s.png")
    table = pq.read_table(tmp_path / "s.parquet")
    assert tuple(table.column_names) == SUMMARY_COLUMNS
    assert table.num_rows == len(rows) and table.to_pylist() == rows
    assert rows[0]["step"] == 7  # sorted by step

    def value(step, task, h_eff, level, metric):
        (match,) = [r["value"] for r in rows if (r["step"], r["task"], r["h_eff"], r["level"],
                                                 r["metric"]) == (step, task, h_eff, level, metric)]
        return match

    khop = report["tasks"]["loopline_khop"]["h_eff"]
    assert value(7, "loopline_khop", 3, 2, "acc") == khop["3"]["levels"]["2"]["acc"]
    assert value(14, "loopline_khop", 3, 2, "acc") == 0.125
    assert value(7, "loopline_addition", 1, None, "exact_match") == \
        report["tasks"]["loopline_addition"]["h_eff"]["1"]["overall"]["exact_match"]
    per_report = sum(len(s["overall"]) + len(s["levels"])
                     for info in report["tasks"].values() for s in info["h_eff"].values())
    assert len(rows) == 2 * per_report
    image = matplotlib.image.imread(tmp_path / "s.png")  # [H, W, RGBA]
    assert image.shape[1] > image.shape[0] > 300 and image.shape[2] == 4
    assert image[..., :3].std() > 0.1  # not blank


def test_summary_input_errors(tmp_path):
    with pytest.raises(DataError, match="no benchmark JSON"):
        summarize_bench([], tmp_path / "s.parquet", tmp_path / "s.png")
    with pytest.raises(DataError, match="missing.json does not exist"):
        summarize_bench([tmp_path / "missing.json"], tmp_path / "s.parquet", tmp_path / "s.png")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        summarize_bench([tmp_path / "bad.json"], tmp_path / "s.parquet", tmp_path / "s.png")


def _samples(scores: list[float], levels: list[int]) -> list[dict]:
    return [{"doc_id": i, "doc": {"level": lv}, "filter": "none", "acc": acc}
            for i, (acc, lv) in enumerate(zip(scores, levels, strict=True))]


def test_task_scores_keep_every_example_and_the_whole_task_interval():
    scores, levels = [1.0, 0.0, 1.0, 1.0, 0.0], [1, 1, 2, 2, 2]
    results = {"results": {"t": {"acc,none": 0.6, "acc_stderr,none": 0.2}},
               "samples": {"t": _samples(scores, levels)}}
    entry = task_scores(results, "t", "acc")
    assert entry["per_sample"] == {"0": 1.0, "1": 0.0, "2": 1.0, "3": 1.0, "4": 0.0}
    assert entry["overall_ci"] == {"acc": {"n": 5, **_ci(3, 5)}}
    assert entry["levels"]["2"] == {"acc": 2 / 3, "n": 3, **_ci(2, 3)}
    unlevelled = task_scores(results, "t", None, sample_metric="acc")  # a passed-through task
    assert "levels" not in unlevelled and unlevelled["overall_ci"] == entry["overall_ci"]
    assert sample_levels(results["samples"]["t"]) == {"0": 1, "1": 1, "2": 2, "3": 2, "4": 2}


def _report_with_pairs() -> dict:
    """H_eff 1, 2, 4 on the same 40 examples (levels 1 and 2): H_eff 4 fixes 16 of level 2."""
    levels = [1] * 20 + [2] * 20
    at = {1: [1.0] * 10 + [0.0] * 10 + [0.0] * 20,
          2: [1.0] * 10 + [0.0] * 10 + [0.0] * 18 + [1.0] * 2,
          4: [1.0] * 10 + [0.0] * 10 + [1.0] * 16 + [0.0] * 4}
    info = {"metric": "acc", "h_eff": {}, "sample_levels": sample_levels(_samples(at[1], levels))}
    for h, scores in at.items():
        results = {"results": {"t": {"acc,none": sum(scores) / 40}},
                   "samples": {"t": _samples(scores, levels)}}
        info["h_eff"][str(h)] = task_scores(results, "t", "acc")
    add_paired_comparisons(info)
    return {"step": 5, "tasks": {"t": info}}


def test_paired_comparisons_land_in_the_json_and_the_table(tmp_path):
    report = _report_with_pairs()
    info = report["tasks"]["t"]
    assert info["paired_baseline"] == 1
    # (h, against) pairs: 2 vs 1; 4 vs 1 and 4 vs 2; each whole task, level 1, level 2.
    assert sorted({(r["h_eff"], r["against"]) for r in info["paired"]}) == [(2, 1), (4, 1), (4, 2)]
    assert len(info["paired"]) == 9
    rows = bench_records(report)
    assert all(set(r) == set(SUMMARY_COLUMNS) for r in rows)
    (hard,) = [r for r in rows if (r["h_eff"], r["level"], r["metric"]) == (4, 2, "acc")]
    assert hard["value"] == 0.8 and hard["n"] == 20
    assert (hard["ci_low"], hard["ci_high"]) == wilson_interval(16, 20)
    assert hard["diff_vs_h1"] == pytest.approx(0.8) and hard["diff_lo"] > 0.5
    assert hard["p_mcnemar"] == pytest.approx(2 / 2 ** 16)  # 16 discordant, all one way
    (easy,) = [r for r in rows if (r["h_eff"], r["level"], r["metric"]) == (4, 1, "acc")]
    assert easy["diff_vs_h1"] == 0.0 and easy["diff_lo"] == 0.0 == easy["diff_hi"]
    assert easy["p_mcnemar"] == 1.0
    (whole,) = [r for r in rows if (r["h_eff"], r["level"], r["metric"]) == (2, None, "acc")]
    assert whole["n"] == 40 and whole["diff_vs_h1"] == pytest.approx(0.05)
    assert whole["diff_lo"] <= 0 <= whole["diff_hi"]  # 2 of 40 examples: not significant
    base = [r for r in rows if r["h_eff"] == 1]
    assert all(r["diff_vs_h1"] is None and r["n"] is not None for r in base)
    path = tmp_path / "step_0000005.json"
    path.write_text(json.dumps(report))
    table = summarize_bench([path], tmp_path / "s.parquet", tmp_path / "s.png")
    assert pq.read_table(tmp_path / "s.parquet").to_pylist() == table == rows


def test_heatmap_cells_and_rows_carry_intervals_and_n():
    info = _report_with_pairs()["tasks"]["t"]
    lo, hi = wilson_interval(16, 20)
    assert _cell_label(info, info["metric"], 4, 2) == f"0.80\n[{lo:.2f},{hi:.2f}]"
    assert _level_label(info, info["metric"], 2) == "2 (n=20)"
