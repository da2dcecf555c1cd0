"""`results-doc`: regenerate the README's results section from a finished run's outputs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("results-doc",
                            help="rewrite README's results section (between the results "
                                 "markers) from results/")
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="results directory of the finished run (with compare/)")
    parser.add_argument("--readme", type=Path, default=Path("README.md"),
                        help="README holding the <!-- results:begin/end --> markers")
    parser.add_argument("--docs", type=Path, default=Path("docs/results"),
                        help="folder the figures are copied into (linked from the README)")
    parser.add_argument("--section", default="",
                        help="fill the markers <!-- results:SECTION:begin/end --> instead "
                             "(a second results section, e.g. of a longer experiment)")
    return parser


def run(args: argparse.Namespace) -> int:
    from ..results_doc import write_results_doc

    write_results_doc(args.results, args.readme, args.docs, args.section)
    print(f"{args.readme}: results section regenerated from {args.results}; figures in "
          f"{args.docs}")
    return 0
