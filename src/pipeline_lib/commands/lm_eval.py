"""``lm-eval``: lm-evaluation-harness's own command line with the ``loopline`` model registered.

``python -m pipeline_lib lm-eval --model loopline --model_args snapshot=DIR,h_eff=4
--tasks loopline_khop --include_path DIR`` — every lm-eval option works, since the arguments
go to lm-eval's parser unchanged (``cli.main`` hands them over before our parser sees them).
One exception: ``--include_path DIR`` is handed over as a mirror of DIR whose relative
``data_files`` are made absolute (as ``bench.include_path``), so they may be written relative
to the YAML instead of to the working directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import PipelineError
from ._common import Command, arg

COMMAND = Command(
    "lm-eval", "lm-evaluation-harness CLI with --model loopline available",
    (arg("lm_eval_args", nargs=argparse.REMAINDER, help="lm-eval arguments"),),
    description="Pass every argument to lm-eval's own command line (see `lm-eval --help`) "
                "after registering the loopline model: --model loopline --model_args "
                "snapshot=DIR,h_eff=N,batch_size=B,device=cpu[,use_ema=true].",
    add_help=False)


def passthrough(argv: Sequence[str]) -> int:
    """Run lm-eval's CLI on ``argv`` with the loopline model registered; its exit status."""
    from lm_eval.__main__ import cli_evaluate  # lm-eval, torch: loads on run, `--help` stays fast

    from .. import bench  # noqa: F401  (registers --model loopline; torch, lm-eval: as above)

    saved = sys.argv
    scratch = tempfile.TemporaryDirectory(prefix="loopline-tasks-")
    try:
        sys.argv = ["lm-eval", *_mirrored_include_path(list(argv), Path(scratch.name))]
        cli_evaluate()
    except SystemExit as exc:  # argparse --help / usage errors
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
        scratch.cleanup()
    return 0


def _mirrored_include_path(argv: list[str], scratch: Path) -> list[str]:
    """``argv`` with the folder of ``--include_path`` replaced by its mirror in ``scratch``."""
    from ..bench.user_tasks import prepare_user_tasks  # lm-eval, torch: as above

    mirror = scratch / "include"
    for i, word in enumerate(argv):
        if word == "--include_path" and i + 1 < len(argv):
            prepare_user_tasks(argv[i + 1], mirror, "--include_path")
            return [*argv[: i + 1], str(mirror), *argv[i + 2:]]
        if word.startswith("--include_path="):
            prepare_user_tasks(word.split("=", 1)[1], mirror, "--include_path")
            return [*argv[:i], f"--include_path={mirror}", *argv[i + 1:]]
    return argv


def run(args: argparse.Namespace) -> int:
    return passthrough(args.lm_eval_args)
