"""Small building blocks: RMSNorm, rotary position embedding (optionally frequency-scaled),
dense SwiGLU FFN."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..spec.config_model import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no bias, no mean subtraction)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@dataclass(frozen=True)
class RopeScaling:
    """How the RoPE frequencies are scaled: ``none``; ``linear`` (every frequency / factor);
    ``llama3`` (Llama 3.1: wavelengths over original_max_position / low_freq_factor are
    divided by the factor, those under original_max_position / high_freq_factor are kept,
    those in between interpolate smoothly). Hashable: the cached tables key on it."""

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    @classmethod
    def of(cls, cfg: ModelConfig) -> RopeScaling:
        """The scaling a model config asks for."""
        return cls(cfg.rope_scaling, float(cfg.rope_scaling_factor),
                   float(cfg.rope_low_freq_factor), float(cfg.rope_high_freq_factor),
                   int(cfg.rope_original_max_position))


NO_SCALING = RopeScaling()


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling = NO_SCALING,
                  dtype: torch.dtype = torch.float64,
                  device: torch.device | None = None) -> Tensor:
    """Frequencies θ^(−2i/head_dim) [head_dim/2] of RoPE, scaled as ``scaling`` says.

    The scaled forms are Hugging Face transformers' (``modeling_rope_utils``: linear,
    ``_compute_llama3_parameters``), step for step, here in ``dtype`` (float64 by default;
    transformers computes in fp32).
    """
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, dtype=dtype, device=device) / half))
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def _llama3_inv_freq(inv_freq: Tensor, s: RopeScaling) -> Tensor:
    low_freq_wavelen = s.original_max_position / s.low_freq_factor
    high_freq_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = ((s.original_max_position / wavelen - s.low_freq_factor)
              / (s.high_freq_factor - s.low_freq_factor))
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(position_ids: Tensor, head_dim: int, theta: float,
                scaling: RopeScaling = NO_SCALING) -> tuple[Tensor, Tensor]:
    """RoPE tables at the given positions, in the form :func:`apply_rope` takes.

    Positions restart at 0 for every document of a packed row, so a document sees the same
    rotations wherever it was packed. Returns two fp32 tensors [B, L, 1, head_dim] (the 1
    broadcasts over heads): (cos ‖ cos) and (−sin ‖ sin) of the angles, looked up on the device
    in a table computed in float64 on the CPU (Ascend NPUs have no float64).
    """
    if torch.compiler.is_compiling():  # train.compile: no host sync, no cache in the graph
        return _rope_direct(position_ids, head_dim, theta, scaling)
    longest = int(position_ids.max()) + 1 if position_ids.numel() else 1
    size = max(64, 1 << (longest - 1).bit_length())  # a power of two: few tables per run
    cos, sin = _rope_table(size, head_dim, float(theta), scaling, position_ids.device)
    return cos[position_ids][:, :, None], sin[position_ids][:, :, None]


def _signed_tables(angles: Tensor) -> tuple[Tensor, Tensor]:
    """Angles [..., head_dim/2] (float64 or fp32) → fp32 (cos ‖ cos), (−sin ‖ sin)."""
    cos, sin = angles.cos().float(), angles.sin().float()
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def _rope_direct(position_ids: Tensor, head_dim: int, theta: float,
                 scaling: RopeScaling = NO_SCALING) -> tuple[Tensor, Tensor]:
    """The same tables computed on the device (float64 where the device has it)."""
    dtype = torch.float32 if position_ids.device.type == "npu" else torch.float64
    inv_freq = rope_inv_freq(head_dim, theta, scaling, dtype, position_ids.device)
    cos, sin = _signed_tables(position_ids.to(dtype)[..., None] * inv_freq)  # [B, L, hd]
    return cos[:, :, None], sin[:, :, None]


@functools.lru_cache(maxsize=16)
def _rope_table(positions: int, head_dim: int, theta: float, scaling: RopeScaling,
                device: torch.device) -> tuple[Tensor, Tensor]:
    """(cos ‖ cos), (−sin ‖ sin) [positions, head_dim] of the angles p·θ^(−2i/head_dim)
    (frequencies scaled by ``scaling``), fp32 on ``device``."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling)
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
