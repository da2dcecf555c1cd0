"""The one-command device check: ``python benchmarks/device_check.py [--only …] [key=value …]``.

The same as ``python -m pipeline_lib device-check`` (see
:mod:`pipeline_lib.workflow.device_check`): on ``experiment.device`` (``auto``: CUDA, then an
Ascend NPU, then the CPU) it runs tiny train steps in the configured precision, a snapshot
resume, compiled FlexAttention across lengths, MoE grouped GEMM against the loop and greedy
generation; a pass/fail table with figures, then one JSON line. Exit status 1 when a check
fails. Run it on a new GPU/NPU node before a real run (minutes at most; seconds on the CPU
apart from FlexAttention's first compile).
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

from pipeline_lib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["device-check", *sys.argv[1:]]))
