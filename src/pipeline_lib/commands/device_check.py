"""`device-check`: the accelerator paths on the configured device, one command (see
:mod:`pipeline_lib.diagnostics`); a table, then the results as one JSON line.
While it runs, each finished check prints its row on stderr and ``--out`` holds the results
so far (``"complete": false``), so a run cut short by a time limit keeps what it measured."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ..diagnostics import BUDGET_S, CHECKS
from ..fsio import write_text_atomic
from ..output_paths import DEVICE_JSON
from ._common import CONFIG, Command, arg, config_from_args, out

COMMAND = Command("device-check", "check the accelerator paths on this device", (
    arg("--only", nargs="+", choices=CHECKS, default=list(CHECKS),
        help="run only these checks (default: all)"),
    arg("--skip", nargs="+", choices=CHECKS, default=[], help="leave these checks out"),
    arg("--quick", action="store_true",
        help="tiny CPU-sized workloads, no FlexAttention compile or Triton interpreter "
             "(seconds; for tests)"),
    out("--out", kind=DEVICE_JSON, default=None, help="also write the JSON here"),
    arg("--budget-s", type=float, default=BUDGET_S,
        help=f"skip the checks that would start after this many seconds (default "
             f"{BUDGET_S:.0f})"),
    arg("--peak-tflops", type=float, default=None,
        help="the GPU's dense bf16 peak, when its name is not in the table"),
    arg("--work-dir", type=Path, default=None,
        help="where the checks write their packs and runs (default: a temporary directory, "
             "removed afterwards; a check that cannot write there fails alone and is "
             "reported)"),
    CONFIG),
    description="Training (steps, 2-segment resume, one-rank FSDP2), kernels (Triton/chunked/"
                "eager cross-entropy, flex vs SDPA, MoE grouped GEMM), bf16 throughput and MFU, "
                "the H_eff sweep, lm-eval and KV-cached generation on experiment.device; "
                "pass/fail/skip with figures. Exit status 1 when a check fails.")


def run(args: argparse.Namespace) -> int:
    # the checks import torch and the trainer: only when the command runs (a fast --help)
    from ..diagnostics.runner import (
        describe_device,
        format_report,
        format_row,
        report_json,
        run_device_check,
    )

    cfg = config_from_args(args)
    device = describe_device(cfg.experiment.device)
    only = [name for name in args.only if name not in args.skip]

    def write(doc: dict) -> None:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(args.out, json.dumps(doc, indent=1) + "\n")

    def progress(results: list) -> None:  # a run killed by a time limit keeps what it did
        print(format_row(results[-1]), file=sys.stderr, flush=True)
        write(report_json(results, device, args.quick, complete=False))

    with tempfile.TemporaryDirectory(prefix="loopline-device-check-") as tmp:
        work = args.work_dir if args.work_dir is not None else Path(tmp)
        results = run_device_check(cfg, work, only, quick=args.quick, budget_s=args.budget_s,
                                   peak_tflops=args.peak_tflops, on_result=progress)
    doc = report_json(results, device, args.quick)
    print(format_report(results, device))
    print(json.dumps(doc))
    write(doc)
    return 1 if any(r.status == "fail" for r in results) else 0
