"""Scores from lm-eval results and the summary table + heatmap figure."""

from __future__ import annotations

import copy
import json

import pyarrow.parquet as pq
import pytest

from pipeline_lib.bench.scoring import (
    SUMMARY_COLUMNS,
    level_scores,
    overall_metrics,
    summarize_bench,
)
from pipeline_lib.errors import DataError


def test_level_scores_and_overall_metrics():
    samples = [{"doc": {"level": lv}, "filter": "none", "acc": acc}
               for lv, acc in [(1, 1.0), (1, 0.0), (1, 1.0), (5, 0.0), (5, 1.0)]]
    samples.append({"doc": {"level": 5}, "filter": "strict", "acc": 1.0})  # other filter: skipped
    assert level_scores(samples, "acc") == {"1": {"acc": 2 / 3, "n": 3}, "5": {"acc": 0.5, "n": 2}}
    results = {"alias": "t", "name": "t", "sample_len": 5, "acc,none": 0.6,
               "acc_stderr,none": "N/A", "exact_match,strict-match": 0.25}
    assert overall_metrics(results) == {"acc": 0.6, "exact_match/strict-match": 0.25}


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
