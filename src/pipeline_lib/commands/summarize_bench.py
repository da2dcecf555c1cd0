"""``summarize-bench``: benchmark JSONs → long table (parquet) and accuracy heatmaps (PNG)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "summarize-bench", help="benchmark JSONs → summary parquet and heatmap figure",
        description="Collect bench JSONs (one per snapshot) into a long table (step, task, h_eff, "
                    "level, metric, value; level empty for whole-task metrics) and plot an "
                    "accuracy heatmap (difficulty × H_eff) per built-in task.")
    parser.add_argument("--inputs", type=Path, nargs="+", required=True,
                        help="bench JSON files (results/{run}/bench/step_*.json)")
    parser.add_argument("--out-parquet", type=Path, required=True, help="summary table to write")
    parser.add_argument("--out-png", type=Path, required=True, help="figure to write")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..bench.scoring import summarize_bench

    rows = summarize_bench(args.inputs, args.out_parquet, args.out_png)
    print(f"{len(rows)} rows from {len(args.inputs)} file(s) → {args.out_parquet}, {args.out_png}")
    return 0
