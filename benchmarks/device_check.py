"""The one-command device check: ``python benchmarks/device_check.py [--quick] [--out F]
[--only …] [--skip …] [key=value …]``.

The same as ``python -m pipeline_lib device-check`` (see
:mod:`pipeline_lib.diagnostics`): on ``experiment.device`` (``auto``: CUDA, then an
Ascend NPU, then the CPU) in ``experiment.precision`` it runs tiny train steps, a 2-segment
resume against one segment, one FSDP2 segment with one rank, Triton vs chunked vs eager
cross-entropy, FlexAttention vs SDPA with the document mask, MoE grouped GEMM vs the loop,
bf16 training tokens/s and MFU of a ~125M-parameter looped model at 4 loops, the H_eff sweep
and lm-eval on the device, greedy samples and KV-cached vs uncached generation. A table
with figures, then one JSON line (``--out``: also to a file); checks or parts that cannot
run here are listed with the reason. Exit status 1 when a check fails. On an H100/H200 it is
sized to finish within 8 minutes (``--budget-s``); on this CPU about a minute.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")

from pipeline_lib.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["device-check", *sys.argv[1:]]))
