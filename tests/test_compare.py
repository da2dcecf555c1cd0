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
