"""`track-init`: find or create a run's MLflow parent run; write {run_dir}/tracking.json; log
the data pack as its ``pack`` child run (the rule ``track_init`` calls the same
:func:`pipeline_lib.workflow.stages.parent_runs.init_tracking`).

Also creates the store schema and the experiment, so the Snakemake local rule that calls
it runs before any parallel job opens the store. Prints the parent run id.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..workflow.stages.parent_runs import init_tracking
from ._common import CONFIG, Command, arg, config_from_args, out

COMMAND = Command(
    "track-init", "create (or find) a run's MLflow parent run; write tracking.json", (
        CONFIG,
        out("--run-dir", required=True,
            help="run directory, results/{run}; tracking.json is written there"),
        arg("--data", type=Path, required=True,
            help="the run's packed data directory (results/data/<data_id>), logged as the "
                 "pack child run"),
        arg("--no-track", action="store_true",
            help="record tracking as disabled in tracking.json; contact no store")))


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    info = init_tracking(cfg, args.run or args.run_dir.name, args.run_dir, args.data)
    print(info["parent_run_id"] or "tracking disabled")
    return 0
