"""`compare`: side-by-side table, summary and plots of several finished runs (the rule
``compare_runs`` calls the same :func:`pipeline_lib.workflow.stages.compare.compare_stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..spec.layout import ResultsLayout
from ._common import Command, arg, out

COMMAND = Command("compare", "compare finished runs (results/{run} directories)", (
    arg("run_dirs", type=Path, nargs="+", help="run directories to compare"),
    out("--out", default=ResultsLayout(Path("results")).compare_dir, help="output dir")))


def run(args: argparse.Namespace) -> int:
    # pandas, matplotlib: loads on run, `--help` stays fast
    from ..workflow.stages.compare import compare_stage

    compare_stage({d.name: d for d in args.run_dirs}, args.out)
    print((args.out / "summary.md").read_text(), end="")
    return 0
