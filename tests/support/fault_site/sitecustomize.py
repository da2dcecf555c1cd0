"""Fault injection where no test can reach in: the trainer of a Snakemake job under SLURM.

A test puts this folder on ``PYTHONPATH`` (the SLURM tests); Python imports this module at
the start of every process. Only in a ``train_segment.py`` rule script it installs what
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


if sys.argv and sys.argv[0].endswith("train_segment.py") and \
        os.environ.get("LOOPLINE_FAULT_INJECT") and _first():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: `support`
    from support.faults import install_from_env

    install_from_env()
