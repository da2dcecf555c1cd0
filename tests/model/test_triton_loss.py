"""The Triton chunk kernel, run by the Triton interpreter on the CPU, matches the torch path.

``TRITON_INTERPRET`` must be set before triton is imported, so the comparison runs in a
fresh interpreter process (this test process may already have imported triton).
Interpreter limits respected: ≤ 64 rows per launch (one program per row), vocab ≤ 4096,
fp32 throughout. Smaller vocabulary blocks force several blocks per row.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = r"""
import json, torch
import torch.nn.functional as F
from pipeline_lib.model.loss import chunked_cross_entropy
import pipeline_lib.model.triton_loss as kernel
torch.set_num_threads(1)
results = []
# max_block < vocab: several vocabulary blocks per row (online logsumexp, ragged last block)
cases = [(64, 16, 4096, 64, "mean", 0, 1024), (50, 8, 1000, 16, "sum", 3, 256),
         (23, 8, 257, 64, "mean", 4, 4096)]
for n, d, v, chunk, reduction, ignore_every, max_block in cases:
    kernel.MAX_BLOCK_V = max_block
    gen = torch.Generator().manual_seed(n)
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * 0.5
    targets = torch.randint(0, v, (n,), generator=gen)
    if ignore_every:
        targets[::ignore_every] = -100
    token_weights = torch.rand(n, generator=gen) if n == 23 else None
    out = {}
    for backend in ("triton", "torch"):
        h = hidden.clone().requires_grad_(True)
        w = weight.clone().requires_grad_(True)
        loss = chunked_cross_entropy(h, w, targets, chunk_size=chunk, reduction=reduction,
                                     token_weights=token_weights, backend=backend)
        loss.backward()
        out[backend] = (loss.detach(), h.grad, w.grad)
    ref = F.cross_entropy(hidden @ weight.T, targets, reduction=reduction)
    diffs = [float((a - b).abs().max()) for a, b in zip(out["triton"], out["torch"])]
    scale = [float(b.abs().max()) for b in out["torch"]]
    results.append({"case": [n, d, v, chunk, reduction], "diffs": diffs, "scale": scale,
                    "ref_diff": None if token_weights is not None
                    else float((out["triton"][0] - ref).abs())})
print(json.dumps(results))
"""


def test_triton_kernel_in_interpreter_matches_torch_path():
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == 3
    for r in results:
        loss_diff, gh_diff, gw_diff = r["diffs"]
        assert loss_diff <= 1e-5 + 5e-4 * r["scale"][0], r
        assert gh_diff <= 1e-5 + 5e-4 * r["scale"][1], r
        assert gw_diff <= 1e-5 + 5e-4 * r["scale"][2], r
        if r["ref_diff"] is not None:
            assert r["ref_diff"] <= 1e-5 + 5e-4 * r["scale"][0], r
