"""Transformer block, pre-norm: x + attn(norm(x)), then x + ffn(norm(x)); or post-norm
(``norm_placement: post``, OLMo-2's): x + norm(attn(x)), then x + norm(ffn(x)). FFN dense or
MoE. Both placements use the same two gains, ``attn_norm`` and ``ffn_norm``."""

from __future__ import annotations

import math
from collections.abc import Iterable

from torch import Tensor, nn

from ..spec.config_model import ModelConfig
from ..spec.size import resolved_ffn_hidden, resolved_moe_hidden
from .attention import Attention, DocumentMask
from .layers import RMSNorm, SwiGLU
from .moe import MoEFFN


class Block(nn.Module):
    """One transformer block; the same module is reused by every loop of the core."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.attn = Attention(d, cfg.n_heads, cfg.n_kv_heads, head_dim=cfg.head_dim,
                              qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm, norm_eps=cfg.norm_eps)
        self.post_norm = cfg.norm_placement == "post"
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.ffn: SwiGLU | MoEFFN
        if cfg.moe_experts:
            self.ffn = MoEFFN(d, resolved_moe_hidden(cfg), cfg.moe_experts, cfg.moe_top_k,
                              cfg.moe_aux_loss_weight, cfg.moe_bias_update_rate)
        else:
            self.ffn = SwiGLU(d, resolved_ffn_hidden(cfg))

    def reset_parameters(self, std: float, out_std: float) -> None:
        """Normal(0, std) weights; residual output projections get the smaller ``out_std``."""
        nn.init.normal_(self.attn.qkv.weight, std=std)
        if self.attn.qkv.bias is not None:
            nn.init.zeros_(self.attn.qkv.bias)
        nn.init.normal_(self.attn.out.weight, std=out_std)
        if isinstance(self.ffn, MoEFFN):
            self.ffn.reset_parameters(std, out_std)
        else:
            nn.init.normal_(self.ffn.gate.weight, std=std)
            nn.init.normal_(self.ffn.up.weight, std=std)
            nn.init.normal_(self.ffn.down.weight, std=out_std)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: DocumentMask) -> Tensor:
        # x: [B, L, D] → [B, L, D]
        if self.post_norm:
            x = x + self.attn_norm(self.attn(x, rope, mask))
            return x + self.ffn_norm(self.ffn(x))
        x = x + self.attn(self.attn_norm(x), rope, mask)
        return x + self.ffn(self.ffn_norm(x))


def fan_in_init(modules: Iterable[nn.Module | None]) -> None:
    """``model.init: fan_in``: every weight matrix of ``modules`` (linear maps [out, in] and
    MoE experts [E, in, out] alike: fan-in is dimension 1) uniform in ±1/√fan_in, nn.Linear's
    own default (Kaiming-uniform with a = √5), without GPT-2's depth scaling; norms and
    biases keep their values."""
    for module in modules:
        for p in (() if module is None else module.parameters()):
            if p.ndim >= 2:
                bound = 1.0 / math.sqrt(p.shape[1])
                nn.init.uniform_(p, -bound, bound)


def residual_out_std(init_std: float, effective_depth: int) -> float:
    """GPT-2 style scaled init of residual output projections: std / sqrt(2·depth).

    ``effective_depth`` counts core blocks once per training loop: that is how many
    residual additions the stream sees.
    """
    return init_std / math.sqrt(2 * max(1, effective_depth))
