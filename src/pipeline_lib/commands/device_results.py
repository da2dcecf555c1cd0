"""`device-results`: rewrite README's device section from a device check's JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_REPORT = Path("docs/device/device_check.json")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("device-results",
                            help="rewrite README's device section (between the results:device "
                                 "markers) from a device check's JSON")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT,
                        help=f"the JSON `device-check --out` wrote (default {DEFAULT_REPORT})")
    parser.add_argument("--readme", type=Path, default=Path("README.md"),
                        help="README holding the <!-- results:device:begin/end --> markers")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..workflow.device_check.doc import write_device_doc

    write_device_doc(args.report, args.readme)
    print(f"{args.readme}: device section regenerated from {args.report}")
    return 0
