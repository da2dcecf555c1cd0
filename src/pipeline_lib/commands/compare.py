"""`compare`: side-by-side table, summary and plots of several finished runs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("compare", help="compare finished runs (results/{run} directories)")
    parser.add_argument("run_dirs", type=Path, nargs="+", help="run directories to compare")
    parser.add_argument("--out", type=Path, default=Path("results/compare"), help="output dir")
    return parser


def run(args: argparse.Namespace) -> int:
    import json

    from ..compare import compare_runs
    from ..errors import DataError

    inputs = {}
    for run_dir in args.run_dirs:
        index = run_dir / "snapshots" / "index.json"
        if not index.is_file():
            raise DataError(f"{index} is missing; finish training run {run_dir.name} first")
        final = json.loads(index.read_text())["final_step"]
        inputs[run_dir.name] = {"heff": run_dir / "eval" / "heff.parquet",
                                "bench": run_dir / "bench" / f"step_{final:07d}.json",
                                "metrics": run_dir / "train" / "metrics.jsonl"}
    compare_runs(inputs, args.out)
    print((args.out / "summary.md").read_text(), end="")
    return 0
