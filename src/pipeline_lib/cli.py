"""Command line: one subcommand per stage, each declared (its ``COMMAND``: name, help texts,
arguments; :class:`pipeline_lib.commands._common.Command`) and run in
``pipeline_lib.commands.<name>``.

Command modules import at module level only what is light (no torch, lm-eval or mlflow
client), so ``--help`` stays fast; a heavy stage is imported when the command runs. Each
command calls the same stage function as its Snakemake rule
(:mod:`pipeline_lib.workflow.stages`), ``--no-track`` being the only difference. A :class:`PipelineError` is
printed as one line and exits with status 2, and so is a storage failure (a full disk, a
read-only mount, a permission: :data:`pipeline_lib.output_set.STORAGE_ERRNOS`) wherever it
happens; anything else is a bug and keeps its traceback. Before a command runs, its declared
outputs pass the output rule (:mod:`pipeline_lib.output_paths`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from .commands import lm_eval
from .commands._common import check_command_paths
from .errors import PREEMPTED_EXIT, PipelineError, Preempted
from .output_set import STORAGE_ERRNOS, storage_error

# Order here is the order in `--help`.
COMMAND_MODULES = [
    "pack",
    "train",
    "snapshot_index",
    "heff",
    "summarize_heff",
    "trajectories",
    "bench",
    "summarize_bench",
    "lm_eval",
    "export",
    "import_hf",
    "retrofit_plan",
    "generate",
    "track_init",
    "sync_tracking",
    "compare",
    "results_doc",
    "schema",
    "device_check",
    "device_results",
]


def _command_modules() -> list:
    return [importlib.import_module(f"pipeline_lib.commands.{name}") for name in COMMAND_MODULES]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline_lib",
        description="loopline stages: each runs alone, exactly as the Snakemake rule runs it.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="STAGE", required=True)
    for module in _command_modules():
        command = module.COMMAND.register(sub)
        labels = {a.dest: a.option_strings[0] if a.option_strings else a.dest
                  for a in command._actions}
        command.set_defaults(_run=module.run, _labels=labels)
    return parser


def _take_overrides(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    extra: list[str]) -> None:
    """``key=value`` overrides are accepted anywhere on a stage's command line: argparse
    fills a ``nargs="*"`` positional from one run of arguments only, so the ones after the
    next option come back unparsed and join ``args.overrides`` here; anything else left
    over is refused as argparse would."""
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    unknown = [item for item in extra if item not in overrides]
    if overrides and hasattr(args, "overrides"):
        args.overrides = [*args.overrides, *overrides]
    elif overrides:
        unknown = extra
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "lm-eval":  # passes everything through to lm-eval's own parser
        return lm_eval.passthrough(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    _take_overrides(parser, args, extra)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    try:
        check_command_paths(args, args._labels)
        return int(args._run(args) or 0)
    except Preempted as exc:  # not a failure of the input: a retry continues
        print(f"stopped: {exc}", file=sys.stderr)
        return PREEMPTED_EXIT
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a storage failure outside a stage's own outputs (an outbox, …)
        if exc.errno not in STORAGE_ERRNOS:
            raise
        print(f"error: {storage_error(exc)}", file=sys.stderr)
        return 2
