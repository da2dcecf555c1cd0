"""`heff`: validation loss of one snapshot at several test-time loop counts, one pass (the
rule ``eval_heff`` calls the same :func:`pipeline_lib.workflow.stages.heff_stage`, tracking included)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from ..output_paths import HEFF_JSON
from ..spec.layout import run_dir_of
from ._common import add_config_args, add_output, add_tracking_args, config_from_args


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("heff", help="H_eff sweep of one snapshot (validation loss per H_eff)",
                            description="Validation loss of --snapshot at every H_eff in "
                                        "eval.h_eff (or --h-eff), logged as the child run "
                                        "eval_heff/step_… of the run's MLflow parent run. "
                                        "Without --config the snapshot's own config.yaml is "
                                        "used.")
    parser.add_argument("--snapshot", type=Path, required=True, help="snapshot directory")
    parser.add_argument("--data", type=Path, required=True, help="packed data directory")
    parser.add_argument("--h-eff", default=None,
                        help="loop counts, e.g. 1,2,4,8 (default: eval.h_eff of the config)")
    add_output(parser, "--out", kind=HEFF_JSON, required=True, help="output JSON file")
    add_config_args(parser)
    add_tracking_args(parser, "run directory whose MLflow parent run the sweep joins "
                              "(default: the run the snapshot belongs to)")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..evaluate.heff import parse_h_eff  # torch: loads on run, `--help` stays fast
    from ..workflow.stages.heff import heff_stage  # torch: likewise

    cfg = config_from_args(args, snapshot=args.snapshot)
    if args.h_eff:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval,
                                                                h_eff=parse_h_eff(args.h_eff)))
    run_dir = args.run_dir if args.run_dir is not None else run_dir_of(args.snapshot)
    result = heff_stage(cfg, run_dir, args.snapshot, args.data, args.out)
    print(json.dumps(result))
    return 0
