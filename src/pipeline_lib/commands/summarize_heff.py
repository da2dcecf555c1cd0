"""`summarize-heff`: table and figure over the H_eff sweeps of every kept snapshot (the rule
``summarize_heff`` calls the same :func:`pipeline_lib.workflow.stages.heff_summary.summarize_heff_stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from ..output_paths import FIGURE, TABLE
from ..workflow.stages.heff_summary import summarize_heff_stage
from ._common import CONFIG, SUMMARY_TRACKING, Command, arg, config_from_args, out, tracking_run_dir

COMMAND = Command("summarize-heff", "parquet table + plot of H_eff sweep results", (
    arg("--inputs", type=Path, nargs="+", required=True, help="sweep JSON files"),
    out("--out-table", kind=TABLE, required=True, help="output .parquet"),
    out("--out-plot", kind=FIGURE, required=True, help="output .png (or .svg, .pdf)"),
    arg("--title", default=None, help="figure title (default: named after the run directory)"),
    out("--out-adaptive-table", kind=TABLE, default=None,
        help="also the adaptive-exit table (.parquet; with --out-adaptive-plot)"),
    out("--out-adaptive-plot", kind=FIGURE, default=None,
        help="also the adaptive-exit figure (.png): loss vs loops used"),
    out("--out-label-table", kind=TABLE, default=None,
        help="also the label-accuracy table (.parquet; with --out-label-plot; empty for "
             "sweeps of unlabelled packs)"),
    out("--out-label-plot", kind=FIGURE, default=None,
        help="also the label-accuracy figure (.png): accuracy vs H_eff per level"),
    CONFIG, SUMMARY_TRACKING),
    description="Table and figure over H_eff sweep JSONs, logged as the child run "
                "eval_summary of --run-dir's MLflow parent run (or nothing with --no-track).")


def run(args: argparse.Namespace) -> int:
    adaptive = (args.out_adaptive_table, args.out_adaptive_plot)
    labels = (args.out_label_table, args.out_label_plot)
    for (table, plot), pair in ((adaptive, "adaptive"), (labels, "label")):
        if (table is None) != (plot is None):
            raise ConfigError(f"--out-{pair}-table and --out-{pair}-plot go together; pass both")
    run_dir = tracking_run_dir(args, "summarize-heff")
    cfg = config_from_args(args)
    title = args.title
    if title is None and args.run_dir is None:  # no run to name the figures after
        title = ""
    rows = summarize_heff_stage(cfg, args.run or run_dir.name, run_dir, args.inputs,
                                args.out_table, args.out_plot, *adaptive, *labels,
                                title=title)
    for table, count in rows.items():
        print(f"{count} rows → {table}")
    return 0
