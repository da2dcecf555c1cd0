"""``python tests/support/faulty_train.py train …``: the normal CLI with test faults installed.

Installs what ``LOOPLINE_FAULT_INJECT`` and ``LOOPLINE_TEST_SNAPSHOT_PAUSE_S`` ask for (see
:mod:`support.faults`), then runs :func:`pipeline_lib.cli.main` unchanged. Subprocess fault
tests (SIGKILL mid-loop or mid-write, NaN on one rank under torchrun) start this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `support` importable

from pipeline_lib.cli import main  # noqa: E402
from support.faults import install_from_env  # noqa: E402

if __name__ == "__main__":
    install_from_env()
    raise SystemExit(main())
