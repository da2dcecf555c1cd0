"""`track-init`: find or create a run's MLflow parent run; write {run_dir}/tracking.json.

Also creates the store schema and the experiment, so the Snakemake local rule that calls
it runs before any parallel job opens the store. Prints the parent run id.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._common import add_config_args, config_from_args


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "track-init", help="create (or find) a run's MLflow parent run; write tracking.json")
    add_config_args(parser)
    parser.add_argument("--run-dir", type=Path, required=True,
                        help="run directory, results/{run}; tracking.json is written there")
    parser.add_argument("--data-id", default=None, help="data_id of the run's packed data (tag)")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..tracking import init_parent_run

    cfg = config_from_args(args)
    run_name = args.run or args.run_dir.name
    info = init_parent_run(cfg, run_name, args.run_dir, args.data_id)
    print(info["parent_run_id"] or "tracking disabled")
    return 0
