"""Building blocks of the exported loopline model (remote code: torch only).

Copied next to ``modeling_loopline.py`` by ``python -m pipeline_lib export``; that file
imports this one relatively, and transformers' ``trust_remote_code`` loads both. Here: RoPE
(with transformers' ``linear`` and ``llama3`` scaling), RMSNorm, the KV cache of a looped
forward pass (:class:`LoopKVCache`), grouped-query attention, SwiGLU and top-k MoE
feed-forward layers, the (pre- or post-norm) block, and the masks of a padded batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig


def rope_inv_freq(config: PretrainedConfig, device: torch.device) -> torch.Tensor:
    """RoPE frequencies [head_dim/2] in fp64: θ^(−2i/head_dim), scaled like transformers'
    ``linear`` (all / factor) or ``llama3`` (``_compute_llama3_parameters``) rope types."""
    half = config.head_dim // 2
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(half, dtype=torch.float64,
                                                         device=device) / half))
    kind, factor = config.rope_scaling_type, config.rope_scaling_factor
    if kind == "linear":
        return inv_freq / factor
    if kind != "llama3":
        return inv_freq
    old, low, high = (config.rope_original_max_position, config.rope_low_freq_factor,
                      config.rope_high_freq_factor)
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rope_tables(position_ids: torch.Tensor, config: PretrainedConfig
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [B, L, 1, head_dim/2] (fp32, angles computed in fp64)."""
    inv_freq = rope_inv_freq(config, position_ids.device)
    angles = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, L, half]
    return angles.cos().float()[:, :, None], angles.sin().float()[:, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+half}) of x [B, L, H, head_dim]."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class LoopKVCache:
    """Keys and values [B, KV, T, hd] of every attention call of a fixed-depth forward pass,
    in call order, for one loop count: prelude blocks; core blocks, loop by loop; coda blocks
    once, on the last loop's state. A forward pass calls :meth:`update` once per attention
    call, in the same order every time: the call's new keys and values are appended and all
    of them returned. Under the exit gate the model keeps ``loopline_adaptive.
    AdaptiveKVCache`` instead (``gated``), which also holds its ``kv_fill``.
    """

    is_compileable = False  # generate() must not try to compile around it
    is_croppable = False  # assisted decoding, which crops, is not supported
    gated = False
    kv_fill: str | None = None

    def __init__(self, num_loops: int) -> None:
        self.num_loops = num_loops
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._call = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens cached so far."""
        return self.keys[0].shape[2] if self.keys else 0

    def begin_pass(self, num_loops: int, gated: bool = False, kv_fill: str | None = None
                   ) -> int:
        """Start a forward pass at ``num_loops`` in the given mode (fixed, or gated with its
        ``kv_fill``); returns the tokens already cached."""
        if (num_loops, gated, kv_fill) != (self.num_loops, self.gated, self.kv_fill):
            raise ValueError(f"this cache holds {_mode(self.num_loops, self.gated, self.kv_fill)}"
                             f"; the pass asks for {_mode(num_loops, gated, kv_fill)} (start a "
                             "new cache for another loop count, exit mode or kv_fill)")
        self._call = 0
        return self.get_seq_length()

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this call's k, v [B, H, L, hd]; all keys and values of the call so far."""
        i, self._call = self._call, self._call + 1
        if i == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[i] = torch.cat([self.keys[i], k], dim=2)
            self.values[i] = torch.cat([self.values[i], v], dim=2)
        return self.keys[i], self.values[i]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep the rows ``beam_idx`` (beam search)."""
        self.keys = [k.index_select(0, beam_idx.to(k.device)) for k in self.keys]
        self.values = [v.index_select(0, beam_idx.to(v.device)) for v in self.values]


def _mode(num_loops: int, gated: bool, kv_fill: str | None) -> str:
    if not gated:
        return f"{num_loops} loops at fixed depth"
    return f"{num_loops} loops read out by the exit gate (kv_fill {kv_fill!r})"


class Attention(nn.Module):
    """Multi-head or grouped-query self-attention with RoPE, fused q/k/v projection (rows:
    q heads, k heads, v heads; a bias with ``qkv_bias``), heads of width ``head_dim``, and
    optionally RMSNorm of queries and keys before RoPE: ``qk_norm`` ``head`` normalises each
    head's channels (one gain shared by the heads), ``all_heads`` all query channels and all
    key channels."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        d, H, KV = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.n_heads, self.n_kv_heads, self.head_dim = H, KV, config.head_dim
        hd, self.qk_norm = self.head_dim, config.qk_norm
        self.qkv = nn.Linear(d, (H + 2 * KV) * hd, bias=config.qkv_bias)
        self.out = nn.Linear(H * hd, d, bias=False)
        if self.qk_norm != "none":
            per_head = self.qk_norm == "head"
            self.q_norm = RMSNorm(hd if per_head else H * hd, config.rms_norm_eps)
            self.k_norm = RMSNorm(hd if per_head else KV * hd, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor, cache: LoopKVCache | None = None) -> torch.Tensor:
        B, L, _ = x.shape
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = self.qkv(x).split((H * hd, KV * hd, KV * hd), dim=-1)
        if self.qk_norm == "all_heads":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.view(B, L, -1, hd) for t in (q, k, v))  # [B, L, heads, hd]
        if self.qk_norm == "head":
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H or KV, L, hd]
        if cache is not None:  # the cached tokens' keys and values come first
            k, v = cache.update(k, v)
        # grouped-query (KV < H): SDPA reads kv head i // (H / KV) for query head i
        gqa = {"enable_gqa": True} if KV != H else {}
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **gqa)
        return self.out(y.transpose(1, 2).reshape(B, L, H * hd))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoEFFN(nn.Module):
    """Top-k routed SwiGLU experts; ``balance_bias`` shifts the selection only."""

    def __init__(self, dim: int, hidden: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w_gate = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w_up = nn.Parameter(torch.empty(n_experts, dim, hidden))
        self.w_down = nn.Parameter(torch.empty(n_experts, hidden, dim))
        self.register_buffer("balance_bias", torch.zeros(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        flat = x.reshape(B * L, D)
        probs = F.linear(flat.float(), self.router.weight.float()).softmax(dim=-1)  # [N, E]
        _, top_idx = torch.topk(probs + self.balance_bias, self.top_k, dim=-1)
        gates = probs.gather(-1, top_idx)  # [N, k]
        if self.top_k > 1:
            gates = gates / gates.sum(dim=-1, keepdim=True)
        ids = top_idx.reshape(-1)  # [N·k]: slot s of token n at n·k + s
        ys = flat.new_zeros(ids.numel(), D)
        for e in range(self.n_experts):
            rows = (ids == e).nonzero().squeeze(1)
            if rows.numel():
                xs = flat[rows // self.top_k]
                h = F.silu(xs @ self.w_gate[e].to(xs.dtype)) * (xs @ self.w_up[e].to(xs.dtype))
                ys[rows] = h @ self.w_down[e].to(xs.dtype)
        y = (ys.view(-1, self.top_k, D) * gates[..., None].to(ys.dtype)).sum(dim=1)
        return y.view(B, L, D)


class Block(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + ffn(norm(x)); or post-norm
    (``norm_placement`` ``post``): x + norm(attn(x)), then x + norm(ffn(x))."""

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.attn_norm = RMSNorm(d, config.rms_norm_eps)
        self.attn = Attention(config)
        self.post_norm = config.norm_placement == "post"
        self.ffn_norm = RMSNorm(d, config.rms_norm_eps)
        if config.moe_experts:
            self.ffn = MoEFFN(d, config.moe_intermediate_size, config.moe_experts,
                              config.moe_top_k)
        else:
            self.ffn = SwiGLU(d, config.intermediate_size)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor, cache: LoopKVCache | None = None) -> torch.Tensor:
        if self.post_norm:
            x = x + self.attn_norm(self.attn(x, rope, mask, cache))
            return x + self.ffn_norm(self.ffn(x))
        x = x + self.attn(self.attn_norm(x), rope, mask, cache)
        return x + self.ffn(self.ffn_norm(x))


def padding_inputs(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                   position_ids: torch.Tensor | None, past: int = 0
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [B, L], attention mask [B, 1, L, past + L] bool) of a causal, maybe padded
    batch whose first ``past`` tokens are cached (``attention_mask`` covers all of them).

    A query attends to earlier real tokens; a padding query to itself only (stays finite).
    """
    B, L = input_ids.shape
    T, dev = past + L, input_ids.device
    mask = torch.ones(L, T, dtype=torch.bool, device=dev).tril(past)[None].expand(B, L, T)
    if attention_mask is None:
        positions = torch.arange(past, T, device=dev).expand(B, L)
    else:
        real = attention_mask.to(dev).bool()[:, -T:]  # [B, T]
        positions = (real.long().cumsum(-1) - 1).clamp_min(0)[:, past:]
        itself = torch.eye(L, T, dtype=torch.bool, device=dev).roll(past, dims=1)
        mask = (mask & real[:, None, :]) | itself
    if position_ids is not None:
        positions = position_ids.to(dev)[:, -L:]
    return positions, mask[:, None]


