"""Summary table and figure of several snapshots' sweeps."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline_lib.errors import DataError
from pipeline_lib.evaluate.heff import sweep_result
from pipeline_lib.evaluate.heff_summary import summarize_heff


def _write(path: Path, step: int, losses: dict[int, float]) -> Path:
    path.write_text(json.dumps(sweep_result(step, losses, 500)))
    return path


def test_summary_table_and_plot(tmp_path: Path):
    inputs = [_write(tmp_path / "b.json", 200, {1: 2.0, 4: 1.6}),
              _write(tmp_path / "a.json", 100, {1: 2.5, 4: 2.6})]
    rows = summarize_heff(inputs, tmp_path / "t.parquet", tmp_path / "p.png", "demo")
    table = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert table == rows
    assert [(r["step"], r["h_eff"], r["loss"]) for r in table] == [
        (100, 1, 2.5), (100, 4, 2.6), (200, 1, 2.0), (200, 4, 1.6)]
    assert [r["deeper_better"] for r in table] == [False, False, True, True]
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_malformed_input_is_named(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(DataError, match="bad.json is not an H_eff sweep result"):
        summarize_heff([bad], tmp_path / "t.parquet", tmp_path / "p.png")
    assert not (tmp_path / "t.parquet").exists()


def test_table_carries_stderr_documents_and_paired_differences(tmp_path: Path):
    import numpy as np

    from pipeline_lib.evaluate.heff_stats import DocumentLosses

    tokens = np.array([10, 20, 30, 40])
    sums = np.stack([tokens * 2.0, tokens * 1.5 + np.array([1.0, -1.0, 2.0, 0.0])], axis=1)
    docs = DocumentLosses([1, 4], sums, tokens)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sweep_result(300, docs.means(), docs.total_tokens, docs)))
    old = _write(tmp_path / "old.json", 100, {1: 2.5, 4: 2.6})  # written before the statistics
    rows = summarize_heff([path, old], tmp_path / "t.parquet", tmp_path / "p.png")
    assert pq.read_table(tmp_path / "t.parquet").to_pylist() == rows
    old_rows, new_rows = rows[:2], rows[2:]
    assert all(r["stderr"] is None and r["diff_vs_h1"] is None for r in old_rows)
    assert [r["documents"] for r in new_rows] == [4, 4]
    assert new_rows[0]["loss"] == 2.0 and new_rows[1]["loss"] == pytest.approx(1.52)
    assert new_rows[0]["stderr"] == 0.0  # every document at exactly 2 nats/token
    assert new_rows[1]["stderr"] > 0
    assert new_rows[0]["diff_vs_h1"] is None
    assert new_rows[1]["diff_vs_h1"] == pytest.approx(-0.48)
    assert new_rows[1]["diff_lo"] <= -0.48 <= new_rows[1]["diff_hi"] < 0
