"""`device-results`: rewrite a page's device section from a device check's JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..output_paths import PAGE
from ._common import add_output

DEFAULT_REPORT = Path("docs/device/device_check.json")
DEFAULT_DOC = Path("docs/performance.md")


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("device-results",
                            help="rewrite the device section (between the results:device "
                                 f"markers, in {DEFAULT_DOC}) from a device check's JSON")
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT,
                        help=f"the JSON `device-check --out` wrote (default {DEFAULT_REPORT})")
    add_output(parser, "--doc", "--readme", dest="doc", kind=PAGE, default=DEFAULT_DOC,
                        help="page holding the <!-- results:device:begin/end --> markers "
                             f"(default {DEFAULT_DOC}; --readme is the same option)")
    return parser


def run(args: argparse.Namespace) -> int:
    # pandas and the results pages: only when the command runs (a fast --help)
    from ..diagnostics.doc import write_device_doc

    write_device_doc(args.report, args.doc)
    print(f"{args.doc}: device section regenerated from {args.report}")
    return 0
