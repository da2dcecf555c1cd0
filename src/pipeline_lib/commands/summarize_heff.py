"""`summarize-heff`: table and figure over the H_eff sweeps of every kept snapshot (the rule
``summarize_heff`` calls the same :func:`pipeline_lib.workflow.stages.heff_summary.summarize_heff_stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ConfigError
from ..output_paths import FIGURE, TABLE
from ..workflow.stages.heff_summary import summarize_heff_stage
from ._common import (
    add_config_args,
    add_output,
    add_tracking_args,
    config_from_args,
    tracking_run_dir,
)


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("summarize-heff", help="parquet table + plot of H_eff sweep results",
                            description="Table and figure over H_eff sweep JSONs, logged as the "
                                        "child run eval_summary of --run-dir's MLflow parent "
                                        "run (or nothing with --no-track).")
    parser.add_argument("--inputs", type=Path, nargs="+", required=True, help="sweep JSON files")
    add_output(parser, "--out-table", kind=TABLE, required=True, help="output .parquet")
    add_output(parser, "--out-plot", kind=FIGURE, required=True,
               help="output .png (or .svg, .pdf)")
    parser.add_argument("--title", default=None,
                        help="figure title (default: named after the run directory)")
    add_output(parser, "--out-adaptive-table", kind=TABLE, default=None,
                        help="also the adaptive-exit table (.parquet; with --out-adaptive-plot)")
    add_output(parser, "--out-adaptive-plot", kind=FIGURE, default=None,
                        help="also the adaptive-exit figure (.png): loss vs loops used")
    add_output(parser, "--out-label-table", kind=TABLE, default=None,
               help="also the label-accuracy table (.parquet; with --out-label-plot; empty "
                    "for sweeps of unlabelled packs)")
    add_output(parser, "--out-label-plot", kind=FIGURE, default=None,
               help="also the label-accuracy figure (.png): accuracy vs H_eff per level")
    add_config_args(parser)
    add_tracking_args(parser, "run directory (results/<run>) whose MLflow parent run the "
                              "summary joins; required unless --no-track")
    return parser


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
