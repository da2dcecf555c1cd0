"""Fault injection where no test can reach in: the trainer of a Snakemake job under SLURM.

A test puts this folder on ``PYTHONPATH`` (the SLURM tests); Python imports this module at
the start of every process. Only in a segment's trainer (the ``train_segment.py`` rule script,
or a torchrun worker of a multi-process segment) it installs what
``LOOPLINE_FAULT_INJECT`` asks for (:mod:`support.faults`): with ``LOOPLINE_TEST_FAULT_ONCE``
set, only once per test (the first process creates that file: the first attempt of a segment
is slow, the retry that resumes it is not); without it, in every segment. Every other process
is left alone.
"""

import os
import sys
from pathlib import Path


def _first() -> bool:
    """True in the first process to ask (or always, without ``LOOPLINE_TEST_FAULT_ONCE``)."""
    once = os.environ.get("LOOPLINE_TEST_FAULT_ONCE")
    if not once:
        return True
    try:
        Path(once).touch(exist_ok=False)
    except FileExistsError:
        return False
    return True


def _trainer() -> bool:
    """A segment's trainer: the rule script, or a worker of a multi-process segment
    (``python -m pipeline_lib train`` under torchrun)."""
    if sys.argv and sys.argv[0].endswith("train_segment.py"):
        return True
    argv = sys.orig_argv  # torchrun: python -u -m pipeline_lib train …
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 3] == [
        "pipeline_lib", "train"]


if os.environ.get("LOOPLINE_FAULT_INJECT") and _trainer() and _first():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: `support`
    from support.faults import install_from_env

    install_from_env()
