"""Label-accuracy summary: the table of every labelled sweep, the figure, and the
summarize-heff options that write them (an unlabelled run gets an empty table)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline_lib.cli import main
from pipeline_lib.evaluate.heff import sweep_result
from pipeline_lib.evaluate.heff_stats import DocumentLosses
from pipeline_lib.evaluate.label_accuracy import label_section
from pipeline_lib.evaluate.label_summary import COLUMNS, summarize_labels

PNG = b"\x89PNG\r\n\x1a\n"


def _sweeps(tmp_path: Path) -> tuple[Path, Path]:
    """(labelled sweep of step 20, unlabelled sweep of step 10): four documents of levels
    1, 2, 3 and unknown, hand-counted label hits at H_eff 1, 2, 4."""
    tokens = np.array([3, 3, 2, 4])
    correct = np.array([[3, 3, 2], [1, 2, 3], [2, 2, 1], [0, 1, 4]], dtype=float)
    docs = DocumentLosses([1, 2, 4], correct, tokens, np.array([1, 2, 3, -1]),
                          np.array([5, 6, 9, 11]))
    labelled = tmp_path / "labelled.json"
    labelled.write_text(json.dumps({**sweep_result(20, {1: 2.0, 2: 1.9, 4: 1.8}, 12),
                                    "labels": label_section(docs, [1, 2], 2)}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(sweep_result(10, {1: 2.5, 2: 2.4, 4: 2.6}, 12)))
    return labelled, plain


def test_table_has_a_row_per_level_and_h_eff_of_labelled_sweeps(tmp_path: Path):
    labelled, plain = _sweeps(tmp_path)
    rows = summarize_labels([plain, labelled], tmp_path / "l.parquet", tmp_path / "l.png", "t")
    assert pq.read_table(tmp_path / "l.parquet").to_pylist() == rows
    assert list(rows[0]) == list(COLUMNS)
    got = [(r["step"], r["level"], r["h_eff"], r["accuracy"], r["exact_match"],
            r["beyond_training"]) for r in rows]
    assert got == [
        (20, 1, 1, 1.0, 1.0, False), (20, 1, 2, 1.0, 1.0, False), (20, 1, 4, 2 / 3, 0.0, False),
        (20, 2, 1, 1 / 3, 0.0, False), (20, 2, 2, 2 / 3, 0.0, False), (20, 2, 4, 1.0, 1.0, False),
        (20, 3, 1, 1.0, 1.0, True), (20, 3, 2, 1.0, 1.0, True), (20, 3, 4, 0.5, 0.0, True),
        (20, None, 1, 6 / 12, 0.5, None), (20, None, 2, 8 / 12, 0.5, None),
        (20, None, 4, 10 / 12, 0.5, None)]
    assert all(0.0 <= r["lo"] <= r["accuracy"] <= r["hi"] <= 1.0 for r in rows)
    assert (tmp_path / "l.png").read_bytes()[:8] == PNG
    section = json.loads(labelled.read_text())["labels"]
    assert (section["levels"]["3"]["best_h_eff"], section["levels"]["3"]["drop_after_best"]) \
        == (1, 0.5)
    assert (section["all"]["best_h_eff"], section["all"]["drop_after_best"]) == (4, 0.0)


def test_unlabelled_sweeps_give_an_empty_table_and_a_figure_saying_so(tmp_path: Path):
    _, plain = _sweeps(tmp_path)
    assert summarize_labels([plain], tmp_path / "l.parquet", tmp_path / "l.png") == []
    table = pq.read_table(tmp_path / "l.parquet")
    assert table.num_rows == 0 and table.column_names == list(COLUMNS)
    assert (tmp_path / "l.png").read_bytes()[:8] == PNG


def test_summarize_heff_writes_the_label_outputs_as_a_pair(tmp_path: Path, capsys):
    labelled, plain = _sweeps(tmp_path)
    base = ["summarize-heff", "--inputs", str(labelled), str(plain), "--out-table",
            str(tmp_path / "h.parquet"), "--out-plot", str(tmp_path / "h.png"), "--no-track"]
    assert main([*base, "--out-label-table", str(tmp_path / "l.parquet"),
                 "--out-label-plot", str(tmp_path / "l.png")]) == 0
    assert pq.read_table(tmp_path / "l.parquet").num_rows == 12
    assert (tmp_path / "l.png").read_bytes()[:8] == PNG
    capsys.readouterr()
    assert main([*base, "--out-label-table", str(tmp_path / "m.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--out-label-table and --out-label-plot go together" in err and "\n" not in err
    assert not (tmp_path / "m.parquet").exists()
