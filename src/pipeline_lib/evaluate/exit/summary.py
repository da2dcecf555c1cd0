"""Summary of the adaptive-exit sections of every kept snapshot's sweep: a table and a figure.

``eval/heff_adaptive.parquet`` (:data:`COLUMNS`): one row per (snapshot step, criterion,
threshold), with the loss, its per-document bootstrap standard error, the mean loops used
and the paired difference to the fixed loss at ``max_loops`` (``diff_vs_fixed`` and its 95%
interval), and what a cached decoder spends under each ``kv_fill`` (``spent_latest_loops``,
``spent_latest_loss``, ``spent_latest_stderr``, the same for ``skip``; empty for sweeps
written before the replay, :mod:`.replay`). ``eval/heff_adaptive.png`` (:mod:`.plot`): loss against (mean) loops
used, every criterion's points and the fixed-H_eff points on the same axes; the last
snapshot in the large panel, earlier ones in small panels below.

Sweeps without an ``adaptive`` section (``eval.adaptive.thresholds: []``, or written before
adaptive exit existed) contribute no rows; with none at all the table is empty and the
figure says so.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...spec.rules import KV_FILLS
from ..heff_summary import read_sweeps, write_parquet
from .plot import plot_adaptive, sections

log = logging.getLogger(__name__)
_SPENT = {f"spent_{fill}_{what}": (fill, key) for fill in KV_FILLS
          for what, key in (("loops", "mean_loops"), ("loss", "loss"), ("stderr", "stderr"))}
COLUMNS = ("step", "criterion", "max_loops", "threshold", "loss", "stderr", "mean_loops",
           "tokens", "fixed_loss", "diff_vs_fixed", "diff_lo", "diff_hi", *_SPENT)
_TYPES = {"step": "int64", "criterion": "string", "max_loops": "int64", "threshold": "float64",
          "loss": "float64", "stderr": "float64", "mean_loops": "float64", "tokens": "int64",
          "fixed_loss": "float64", "diff_vs_fixed": "float64", "diff_lo": "float64",
          "diff_hi": "float64", **dict.fromkeys(_SPENT, "float64")}


def adaptive_rows(sweeps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Long format: one row per (snapshot step, criterion, threshold) of the sweeps."""
    rows = []
    for doc in sweeps:
        for section in sections(doc):
            _section_rows(doc, section, rows)
    return rows


def _section_rows(doc: dict[str, Any], section: dict[str, Any], rows: list) -> None:
    for point in section["points"]:
        diff = point.get("vs_fixed", {})
        rows.append({"step": doc.get("step"), "criterion": section["criterion"],
                     "max_loops": int(section["max_loops"]),
                     "threshold": float(point["threshold"]), "loss": float(point["loss"]),
                     "stderr": point.get("stderr"), "mean_loops": float(point["mean_loops"]),
                     "tokens": int(point["tokens"]), "fixed_loss": section.get("fixed_loss"),
                     "diff_vs_fixed": diff.get("diff"), "diff_lo": diff.get("lo"),
                     "diff_hi": diff.get("hi"),
                     **{col: point.get("spent", {}).get(fill, {}).get(key)
                        for col, (fill, key) in _SPENT.items()}})


def summarize_adaptive(inputs: Sequence[Path], out_table: Path, out_plot: Path,
                       title: str = "") -> list[dict[str, Any]]:
    """Read every sweep JSON, write the adaptive table and figure; return the rows."""
    sweeps = read_sweeps(inputs)
    rows = adaptive_rows(sweeps)
    write_parquet(rows, COLUMNS, _TYPES, out_table)
    plot_adaptive(sweeps, out_plot, title)
    log.info("adaptive-exit summary: %d rows → %s, %s", len(rows), out_table, out_plot)
    return rows
