"""Triton kernel for one chunk of the chunked cross-entropy (used on CUDA).

One program per row of the chunk's logits [C, V]: an online max / sum-of-exp pass over the
vocabulary gives the logsumexp and the row's loss; when gradients are wanted, a second pass
overwrites the row in place with ``scale·(softmax − onehot)``, the gradient of the logits.
So forward and backward of the softmax cross-entropy cost two reads and one write of the
chunk, with no temporaries (torch needs several passes and buffers).

Tested on the CPU with ``TRITON_INTERPRET=1`` (set before triton is imported), where the
kernel runs on CPU tensors; the interpreter's bf16 ``tl.dot`` is unreliable, which is one
reason the matmuls stay in torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the triton extra is optional; callers check triton_available()
    triton = None
    tl = None

MAX_BLOCK_V = 4096


def triton_available() -> bool:
    """Whether triton imported (the kernel itself is compiled lazily on first use)."""
    return triton is not None


if triton is not None:

    @triton.jit
    def _ce_chunk_kernel(logits_ptr, stride_row, targets_ptr, scale_ptr, loss_ptr, V,
                         ignore_index, COMPUTE_GRAD: tl.constexpr, BLOCK_V: tl.constexpr):
        row = tl.program_id(0)
        row_ptr = logits_ptr + row.to(tl.int64) * stride_row
        target = tl.load(targets_ptr + row)
        # Online logsumexp over vocabulary blocks (running max m, running Σ exp(x − m)).
        m = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
        s = tl.sum(tl.zeros([BLOCK_V], tl.float32), axis=0)
        for off in range(0, V, BLOCK_V):
            cols = off + tl.arange(0, BLOCK_V)
            x = tl.load(row_ptr + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
            m = m_new
        lse = m + tl.log(s)
        valid = target != ignore_index
        safe_t = tl.where(valid, target, 0)
        x_t = tl.load(row_ptr + safe_t).to(tl.float32)
        tl.store(loss_ptr + row, tl.where(valid, lse - x_t, 0.0))
        if COMPUTE_GRAD:
            scale = tl.load(scale_ptr + row).to(tl.float32)  # 0 for ignored targets
            for off in range(0, V, BLOCK_V):
                cols = off + tl.arange(0, BLOCK_V)
                x = tl.load(row_ptr + cols, mask=cols < V, other=0.0).to(tl.float32)
                g = tl.exp(x - lse) * scale
                g = tl.where(cols == safe_t, g - scale, g)
                tl.store(row_ptr + cols, g, mask=cols < V)


def chunk_step_triton(logits: Tensor, targets: Tensor, scale: Tensor, ignore_index: int,
                      compute_grad: bool) -> Tensor:
    """Same contract as ``loss._chunk_step_torch``: losses [C]; logits → their gradient."""
    assert triton is not None, "triton is not installed"
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    C, V = logits.shape
    losses = torch.empty(C, dtype=torch.float32, device=logits.device)
    if C == 0:
        return losses
    block_v = min(triton.next_power_of_2(V), MAX_BLOCK_V)
    _ce_chunk_kernel[(C,)](logits, logits.stride(0), targets.contiguous(),
                           scale.contiguous().float(), losses, V, ignore_index,
                           COMPUTE_GRAD=compute_grad, BLOCK_V=block_v, num_warps=8)
    return losses
