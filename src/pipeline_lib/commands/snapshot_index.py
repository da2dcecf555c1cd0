"""``snapshot-index``: a run's snapshots/index.json and the ``final`` link beside it (the rule
``snapshot_index`` calls the same :func:`pipeline_lib.workflow.stages.data.index_stage`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..output_paths import INDEX_JSON
from ._common import Command, arg, out

COMMAND = Command(
    "snapshot-index", "write a run's snapshots/index.json and its final link", (
        arg("snapshots", type=Path, nargs="+", metavar="SNAPSHOT",
            help="the kept snapshot directories (results/<run>/snapshots/step_…)"),
        out("--out", kind=INDEX_JSON, required=True,
            help="the index to write (results/<run>/snapshots/index.json)")),
    description="List the given snapshots (step, folder, manifest file count) in --out and "
                "point the link final beside it at the one with the last step; both are "
                "replaced atomically. The snapshots must lie beside --out. No MLflow run: the "
                "train run that wrote the snapshots holds their story.")


def run(args: argparse.Namespace) -> int:
    # tokenizers (the data stages' module): loads on run, `--help` stays fast
    from ..workflow.stages.data import index_stage

    doc = index_stage(args.out, args.snapshots)
    print(f"{len(doc['kept'])} snapshot(s), final {doc['final']} (step {doc['final_step']}): "
          f"{args.out}")
    return 0
