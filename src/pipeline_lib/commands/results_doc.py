"""`results-doc`: regenerate a page's results section from a finished run's outputs."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..output_paths import PAGE
from ..results_doc import write_results_doc
from ._common import Command, arg, out

COMMAND = Command(
    "results-doc", "rewrite a page's results section (between its results markers) from "
                   "results/", (
        arg("--results", type=Path, default=Path("results"),
            help="results directory of the finished run (with compare/)"),
        out("--doc", "--readme", dest="doc", kind=PAGE, default=Path("docs/results.md"),
            help="page holding the <!-- results:begin/end --> markers (default "
                 "docs/results.md; --readme is the same option)"),
        out("--docs", default=Path("docs/results"),
            help="folder the figures are copied into (linked relative to the page)"),
        arg("--section", default="",
            help="fill the markers <!-- results:SECTION:begin/end --> instead (a second "
                 "results section, e.g. of a longer experiment)"),
        out("--summary", kind=PAGE, default=None,
            help="also rewrite this page's <!-- results:summary:begin/end --> (the front "
                 "page, README.md): a short summary linking the page")))


def run(args: argparse.Namespace) -> int:
    write_results_doc(args.results, args.doc, args.docs, args.section, args.summary)
    also = f" and {args.summary}'s summary" if args.summary else ""
    print(f"{args.doc}: results section{also} regenerated from {args.results}; figures in "
          f"{args.docs}")
    return 0
