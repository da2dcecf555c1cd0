"""The H_eff sweeps of every kept snapshot as tables and figures: child run ``eval_summary``
(torch-free: the summary job loads no model)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ...evaluate.exit.summary import summarize_adaptive
from ...evaluate.heff_summary import summarize_heff
from ...evaluate.label_summary import summarize_labels
from ...output_paths import FIGURE, TABLE
from ...output_set import output_set
from ...spec.config import Config
from ...spec.layout import RunLayout
from ...tracking import start_stage
from .common import check_stage_outputs


def summarize_heff_stage(cfg: Config, run: str, run_dir: Path, inputs: Sequence[Path],
                         table: Path, plot: Path, adaptive_table: Path | None = None,
                         adaptive_plot: Path | None = None, label_table: Path | None = None,
                         label_plot: Path | None = None, *,
                         title: str | None = None) -> dict[Path, int]:
    """Parquet table + figure over every kept snapshot's sweep (and of their adaptive-exit
    sections and their label accuracy, when those paths are given), logged as
    ``eval_summary``. Returns the rows written per table; ``title`` (default: named after
    ``run``) heads every figure."""
    check_stage_outputs(cfg, run_dir, [(table, TABLE), (plot, FIGURE), (adaptive_table, TABLE),
                                       (adaptive_plot, FIGURE), (label_table, TABLE),
                                       (label_plot, FIGURE)],
                        [("--inputs", path) for path in inputs])
    parts = [(Path(t), Path(p), summarize, what) for t, p, summarize, what in (
        (table, plot, summarize_heff, "validation loss vs H_eff"),
        (adaptive_table, adaptive_plot, summarize_adaptive, "adaptive exit vs fixed H_eff"),
        (label_table, label_plot, summarize_labels, "label accuracy vs H_eff"))
        if t is not None and p is not None]
    with output_set() as outputs:  # the tables and figures appear together or not at all
        rows = {t: len(summarize(list(inputs), outputs.file(t), outputs.file(p),
                                 title=f"{run}: {what}" if title is None else title))
                for t, p, summarize, what in parts}
    with start_stage(cfg, run_dir, "eval_summary") as stage:
        for t, p, _, _ in parts:
            stage.log_artifact(t, "eval")
            stage.log_artifact(p, "eval")
        layout = RunLayout.at(run_dir)
        for tsv in layout.benchmarks("eval_heff") + layout.benchmarks("train_segment"):
            stage.log_artifact(tsv, "benchmarks")
    return rows
