"""`heff`: validation loss of one snapshot at several test-time loop counts, one pass (the
rule ``eval_heff`` calls the same :func:`pipeline_lib.workflow.stages.heff_stage`, tracking included)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..output_paths import HEFF_JSON
from ._common import CONFIG, DATA, OWN_CONFIG, SNAPSHOT, Command, arg, out, snapshot_setup, tracking

COMMAND = Command("heff", "H_eff sweep of one snapshot (validation loss per H_eff)", (
    SNAPSHOT, DATA,
    arg("--h-eff", default=None,
        help="loop counts, e.g. 1,2,4,8 (default: eval.h_eff of the config)"),
    out("--out", kind=HEFF_JSON, required=True, help="output JSON file"),
    CONFIG, tracking("the sweep joins")),
    description="Validation loss of --snapshot at every H_eff in eval.h_eff (or --h-eff), "
                "logged as the child run eval_heff/step_… of the run's MLflow parent run. "
                + OWN_CONFIG)


def run(args: argparse.Namespace) -> int:
    from ..evaluate.heff import parse_h_eff  # torch: loads on run, `--help` stays fast
    from ..workflow.stages.heff import heff_stage  # torch: likewise

    cfg, run_dir = snapshot_setup(args)
    if args.h_eff:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval,
                                                                h_eff=parse_h_eff(args.h_eff)))
    result = heff_stage(cfg, run_dir, args.snapshot, args.data, args.out)
    print(json.dumps(result))
    return 0
