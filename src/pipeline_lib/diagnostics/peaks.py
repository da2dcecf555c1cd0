"""Dense bf16 tensor-core peaks of known GPUs (TFLOP/s, without sparsity), by device name.

From the vendors' data sheets; the first pattern that matches ``torch.cuda.get_device_name``
wins, so the specific names (NVL, PCIe) come before the general ones. An unknown device
gets no peak (pass ``--peak-tflops``), and its model FLOP utilisation is reported as skipped.
"""

from __future__ import annotations

import re

BF16_PEAK_TFLOPS: tuple[tuple[str, str, float], ...] = (
    (r"H100.*NVL", "H100 NVL", 835.0),
    (r"H100.*PCIe", "H100 PCIe", 756.0),
    (r"H100", "H100 SXM", 989.4),
    (r"H200.*NVL", "H200 NVL", 835.0),
    (r"GH200|H200", "H200 SXM", 989.4),
    (r"A100", "A100 (40/80 GB, SXM/PCIe)", 312.0),
    (r"L40S", "L40S", 362.0),
    (r"RTX 4090", "GeForce RTX 4090", 165.2),
    (r"\bA10\b", "A10", 125.0),
    (r"\bL4\b", "L4", 121.0),
)


def bf16_peak(device_name: str) -> tuple[str, float] | None:
    """(label, dense bf16 TFLOP/s) of the GPU called ``device_name``, or None when unknown."""
    for pattern, label, tflops in BF16_PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return label, tflops
    return None
