"""Small building blocks: RMSNorm, rotary position embedding, dense SwiGLU FFN."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no bias, no mean subtraction)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(position_ids: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin tables for RoPE at the given positions.

    Positions restart at 0 for every document of a packed row, so a document sees the same
    rotations wherever it was packed. Returns two fp32 tensors [B, L, 1, head_dim/2]
    (the 1 broadcasts over heads).
    """
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64,
                                             device=position_ids.device) / half))
    angles = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, L, half]
    return angles.cos().float()[:, :, None], angles.sin().float()[:, :, None]


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+half}) of x [B, L, H, head_dim] by the position angles."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.to(x.dtype)


class SwiGLU(nn.Module):
    """Dense feed-forward: down(silu(gate(x)) · up(x)), no biases."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:  # x: [B, L, D]
        return self.down(F.silu(self.gate(x)) * self.up(x))
