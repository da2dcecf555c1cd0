"""Fault injection where no test can reach in: the trainer of a Snakemake job under SLURM.

A test puts this folder on ``PYTHONPATH`` (the SLURM time-limit test); Python imports this
module at the start of every process. Only in a ``train_segment.py`` rule script, and only
once per test (the first process creates ``LOOPLINE_TEST_FAULT_ONCE``), it installs what
``LOOPLINE_FAULT_INJECT`` asks for (:mod:`support.faults`): the first attempt of a segment is
slow, the retry that resumes it is not. Every other process is left alone.
"""

import os
import sys
from pathlib import Path

_ONCE = os.environ.get("LOOPLINE_TEST_FAULT_ONCE")
if _ONCE and sys.argv and sys.argv[0].endswith("train_segment.py"):
    try:
        Path(_ONCE).touch(exist_ok=False)
    except FileExistsError:
        pass
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: `support`
        from support.faults import install_from_env

        install_from_env()
