"""``summarize-bench``: benchmark JSONs → long table (parquet) and accuracy heatmaps (PNG) (the
rule ``summarize_bench`` calls the same :func:`pipeline_lib.workflow.stages.bench.summarize_bench_stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..output_paths import FIGURE, TABLE
from ._common import CONFIG, SUMMARY_TRACKING, Command, arg, config_from_args, out, tracking_run_dir

COMMAND = Command(
    "summarize-bench", "benchmark JSONs → summary parquet and heatmap figure", (
        arg("--inputs", type=Path, nargs="+", required=True,
            help="bench JSON files (results/{run}/bench/step_*.json)"),
        out("--out-parquet", kind=TABLE, required=True, help="summary table to write"),
        out("--out-png", kind=FIGURE, required=True,
            help="figure to write (.png, .svg or .pdf)"),
        CONFIG, SUMMARY_TRACKING),
    description="Collect bench JSONs (one per snapshot) into a long table (step, task, h_eff, "
                "level, metric, value; level empty for whole-task metrics) and plot an "
                "accuracy heatmap (difficulty × H_eff) per built-in task; logged as the child "
                "run bench_summary of --run-dir's MLflow parent run (or nothing with "
                "--no-track).")


def run(args: argparse.Namespace) -> int:
    # torch, lm-eval (the bench package): loads on run, `--help` stays fast
    from ..workflow.stages.bench import summarize_bench_stage

    run_dir = tracking_run_dir(args, "summarize-bench")
    rows = summarize_bench_stage(config_from_args(args), args.run or run_dir.name, run_dir,
                                 args.inputs, args.out_parquet, args.out_png)
    print(f"{rows[args.out_parquet]} rows from {len(args.inputs)} file(s) → {args.out_parquet}, "
          f"{args.out_png}")
    return 0
