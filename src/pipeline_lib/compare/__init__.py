"""Cross-variant comparison: one table, a markdown summary, the depth check and plots.

Per variant it reads the final snapshot's H_eff sweep, final benchmark JSON, training curve
and config (:mod:`.runs`). Every accuracy carries n and its 95% interval, every loss its
token count and standard error; the findings call a depth effect only where the PAIRED
interval of H_eff=h against the baseline H_eff (1) excludes zero (:func:`verdict`), and the
depth check (:mod:`.depth`) compares looped variants with shallow and deep ones on the same
benchmark examples; under adaptive exit, accuracy is set against the compute each setting
spent: loops used and computed per token, KV bytes and wall time (:mod:`.spent`,
:func:`.markdown.loops_table`, ``accuracy_vs_loops.png``); sampled scores (pass@k, maj@k)
against the compute per answer, samples × loops (:mod:`.answers`, ``accuracy_vs_compute.png``). When some variant's final H_eff
sweep has a ``labels`` section (a labelled task), the labelled depth check (:mod:`.labels`)
adds ``labels_depth.json`` and ``labels_accuracy.png`` and opens ``summary.md``; without one,
neither file is written (a stale one is removed), like ``accuracy_vs_loops.png``. The MLflow UI shows the same
numbers run by run; this is the side-by-side view that also lands in ``snakemake --report``
and in the docs' generated results (:mod:`pipeline_lib.results_doc`).

Modules: :mod:`.runs` (loading, long table), :mod:`.spent` (compute spent per setting),
:mod:`.answers` (compute per answer: samples × depth),
:mod:`.depth` (cross-variant paired comparisons), :mod:`.labels` (the same on labelled tasks,
per document), :mod:`.markdown` and :mod:`.labels_markdown` (tables, findings),
:mod:`.plots`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..output_paths import DEPTH_JSON, Output, check_output_dir, check_outputs
from ..output_set import output_set
from .answers import COMPUTE_PLOT, samples_more_than_once
from .depth import TARGET_MARGIN, compare_examples, depth_check, depth_markdown, variant_kind
from .labels import LABELS_JSON, LABELS_PLOT, labels_depth_check
from .markdown import summary_markdown, verdict
from .plots import LOOPS_PLOT, plot_comparison, plot_labels_accuracy, plot_val_loss_curves
from .runs import (
    COLUMNS,
    TAIL_STEPS,
    RunResults,
    Score,
    TaskSamples,
    comparison_rows,
    load_run_results,
    load_runs,
    run_dir_inputs,
    val_loss_curves,
    write_table,
)

__all__ = ["COLUMNS", "DEPTH_CHECK_JSON", "LABELS_JSON", "LABELS_PLOT", "TAIL_STEPS", "TARGET_MARGIN", "RunResults", "Score",
           "TaskSamples", "check_compare_outputs", "compare_examples", "compare_runs", "comparison_rows", "depth_check",
           "depth_markdown", "labels_depth_check", "load_run_results", "load_runs", "plot_comparison",
           "plot_val_loss_curves", "run_dir_inputs", "summary_markdown", "val_loss_curves",
           "variant_kind", "verdict"]

log = logging.getLogger(__name__)
DEPTH_CHECK_JSON = "depth_check.json"
# what compare_runs writes into its directory (the plots: pipeline_lib.compare.plots)
COMPARE_FILES = ("summary.md", "summary.parquet", DEPTH_CHECK_JSON, "loss_vs_heff.png",
                 "accuracy_vs_heff.png", "train_loss.png", LABELS_JSON, LABELS_PLOT)


def is_compare_dir(path: Path) -> bool:
    """Whether ``path`` holds a comparison :func:`compare_runs` wrote (one of its files)."""
    return any((Path(path) / name).is_file() for name in COMPARE_FILES)


def check_compare_outputs(out_dir: Path, depth_json: Path | None = None) -> None:
    """Before any run is read: ``out_dir`` is new, empty or a comparison, and the depth
    check's file can be written (one line each)."""
    check_output_dir(Path(out_dir), "compare output", owned=is_compare_dir,
                     kind="a comparison (no summary.md, summary.parquet or its plots)")
    depth = Path(depth_json) if depth_json is not None else Path(out_dir) / DEPTH_CHECK_JSON
    check_outputs([Output(depth, "depth check output", DEPTH_JSON)])


def compare_runs(inputs: Mapping[str, Mapping[str, Path]], out_dir: Path,
                 depth_json: Path | None = None) -> list[dict[str, Any]]:
    """``inputs``: run → {"heff": parquet, "bench": final bench JSON, "metrics": jsonl,
    optionally "config": the final snapshot's config.yaml (default: the one the bench JSON's
    snapshot holds) and "sweep": the final snapshot's H_eff sweep JSON (its labels section)}.

    Writes ``summary.md``, ``summary.parquet``, the plots and the depth check
    (``depth_json``, default ``out_dir/depth_check.json``) into ``out_dir``, and, when some
    sweep has a labels section, ``labels_depth.json`` and ``labels_accuracy.png``; all
    together once every one is written (:mod:`pipeline_lib.output_set`); returns the table
    rows.
    """
    out_dir = Path(out_dir)
    depth_json = Path(depth_json) if depth_json is not None else out_dir / DEPTH_CHECK_JSON
    check_compare_outputs(out_dir, depth_json)
    runs = load_runs(inputs)
    rows = comparison_rows(runs)
    with output_set() as outputs:
        staged = outputs.folder(out_dir)
        write_table(rows, staged / "summary.parquet")
        depth = depth_check(runs)
        depth_file = (staged / depth_json.name if depth_json.parent == out_dir
                      else outputs.file(depth_json))
        depth_file.write_text(json.dumps(depth, indent=1) + "\n")
        labels = labels_depth_check(runs)
        (staged / "summary.md").write_text(summary_markdown(runs, depth, labels))
        plot_comparison(runs, staged)
        if labels is not None:
            (staged / LABELS_JSON).write_text(json.dumps(labels, indent=1) + "\n")
            plot_labels_accuracy(labels, staged / LABELS_PLOT)
    stale = ([] if any(r.adaptive for r in runs) else [LOOPS_PLOT]) + (
        [] if any(samples_more_than_once(r.answers) for r in runs) else [COMPUTE_PLOT]) + (
        [LABELS_JSON, LABELS_PLOT] if labels is None else [])
    for name in stale:  # figures and files of an earlier comparison
        (out_dir / name).unlink(missing_ok=True)
    log.info("compared %d runs → %s", len(runs), out_dir)
    return rows
