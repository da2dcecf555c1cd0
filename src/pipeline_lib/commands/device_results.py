"""`device-results`: rewrite a page's device section from a device check's JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..output_paths import PAGE
from ._common import Command, arg, out

DEFAULT_REPORT = Path("docs/device/device_check.json")
DEFAULT_DOC = Path("docs/performance.md")


COMMAND = Command(
    "device-results", "rewrite the device section (between the results:device markers, in "
                      f"{DEFAULT_DOC}) from a device check's JSON", (
        arg("--report", type=Path, default=DEFAULT_REPORT,
            help=f"the JSON `device-check --out` wrote (default {DEFAULT_REPORT})"),
        out("--doc", "--readme", dest="doc", kind=PAGE, default=DEFAULT_DOC,
            help="page holding the <!-- results:device:begin/end --> markers (default "
                 f"{DEFAULT_DOC}; --readme is the same option)")))


def run(args: argparse.Namespace) -> int:
    # pandas and the results pages: only when the command runs (a fast --help)
    from ..diagnostics.doc import write_device_doc

    write_device_doc(args.report, args.doc)
    print(f"{args.doc}: device section regenerated from {args.report}")
    return 0
