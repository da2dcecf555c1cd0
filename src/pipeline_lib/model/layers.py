"""Small building blocks: RMSNorm, rotary position embedding, dense SwiGLU FFN."""

from __future__ import annotations

import functools

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
    """RoPE tables at the given positions, in the form :func:`apply_rope` takes.

    Positions restart at 0 for every document of a packed row, so a document sees the same
    rotations wherever it was packed. Returns two fp32 tensors [B, L, 1, head_dim] (the 1
    broadcasts over heads): (cos ‖ cos) and (−sin ‖ sin) of the angles, looked up on the device
    in a table computed in float64 on the CPU (Ascend NPUs have no float64).
    """
    if torch.compiler.is_compiling():  # train.compile: no host sync, no cache in the graph
        return _rope_direct(position_ids, head_dim, theta)
    longest = int(position_ids.max()) + 1 if position_ids.numel() else 1
    size = max(64, 1 << (longest - 1).bit_length())  # a power of two: few tables per run
    cos, sin = _rope_table(size, head_dim, float(theta), position_ids.device)
    return cos[position_ids][:, :, None], sin[position_ids][:, :, None]


def _signed_tables(angles: Tensor) -> tuple[Tensor, Tensor]:
    """Angles [..., head_dim/2] (float64 or fp32) → fp32 (cos ‖ cos), (−sin ‖ sin)."""
    cos, sin = angles.cos().float(), angles.sin().float()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _rope_direct(position_ids: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """The same tables computed on the device (float64 where the device has it)."""
    dtype = torch.float32 if position_ids.device.type == "npu" else torch.float64
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=dtype, device=position_ids.device)
                                / half))
    cos, sin = _signed_tables(position_ids.to(dtype)[..., None] * inv_freq)  # [B, L, hd]
    return cos[:, :, None], sin[:, :, None]


@functools.lru_cache(maxsize=16)
def _rope_table(positions: int, head_dim: int, theta: float,
                device: torch.device) -> tuple[Tensor, Tensor]:
    """(cos ‖ cos), (−sin ‖ sin) [positions, head_dim] of the angles p·θ^(−2i/head_dim), fp32
    on ``device``."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq  # [P, half]
    cos, sin = _signed_tables(angles)
    return cos.to(device), sin.to(device)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (x_i, x_{i+half}) of x [B, L, H, head_dim] by the position angles.

    ``cos``/``sin`` are :func:`rope_tables`' (cos ‖ cos) and (−sin ‖ sin), so the rotation
    (x1·cos − x2·sin, x2·cos + x1·sin) is x·cos + swap_halves(x)·sin: the same products and
    sums, bit for bit, in fewer operations.
    """
    xf = x.float()
    out = xf * cos + xf.roll(x.shape[-1] // 2, dims=-1) * sin
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
