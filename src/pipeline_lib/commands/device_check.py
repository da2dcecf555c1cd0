"""`device-check`: the accelerator paths on the configured device, one command (see
:mod:`pipeline_lib.workflow.device_check`); a table, then the results as one JSON line."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from ._common import add_config_args, config_from_args


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from ..workflow.device_check import CHECKS

    parser = sub.add_parser("device-check", help="check the accelerator paths on this device",
                            description="Tiny train steps in the configured precision, a "
                                        "snapshot resume, compiled FlexAttention without "
                                        "recompiles, MoE grouped GEMM vs the loop and greedy "
                                        "generation on experiment.device; pass/fail with "
                                        "figures. Exit status 1 when a check fails.")
    parser.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS),
                        help="run only these checks (default: all)")
    parser.add_argument("--skip", nargs="+", choices=CHECKS, default=[],
                        help="leave these checks out")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the checks write their tiny pack and runs (default: a "
                             "temporary directory, removed afterwards)")
    add_config_args(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from ..workflow.device_check import describe_device, format_report, run_device_check

    cfg = config_from_args(args)
    device = describe_device(cfg.experiment.device)
    only = [name for name in args.only if name not in args.skip]
    with tempfile.TemporaryDirectory(prefix="loopline-device-check-") as tmp:
        work = args.work_dir if args.work_dir is not None else Path(tmp)
        results = run_device_check(cfg, work, only)
    print(format_report(results, device))
    checks = {r.name: {"status": r.status, **r.figures, **({"detail": r.detail} if r.detail
                                                           else {})} for r in results}
    print(json.dumps({**device, "checks": checks}))
    return 1 if any(r.status == "fail" for r in results) else 0
