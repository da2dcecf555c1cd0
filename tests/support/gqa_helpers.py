"""Grouped-query attention in the tests: a grouped model's weights as the plain multi-head
model that computes the same function, and gradients folded back."""

from __future__ import annotations

import torch


def repeated_kv(qkv: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """A grouped-query ``attn.qkv.weight`` [(H + 2KV)·hd, D] as the KV = H weight that computes
    the same: each kv head repeated for the H/KV query heads that read it (head i reads kv
    head i // (H/KV))."""
    hd = qkv.shape[1] // n_heads
    q, k, v = qkv.split((n_heads * hd, n_kv_heads * hd, n_kv_heads * hd))
    group = n_heads // n_kv_heads
    k, v = (t.view(n_kv_heads, hd, -1).repeat_interleave(group, 0).reshape(n_heads * hd, -1)
            for t in (k, v))
    return torch.cat([q, k, v])


def grouped_kv_grad(grad: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """The gradient of a repeated weight (:func:`repeated_kv`) folded back onto the grouped
    one: each kv head's rows get the sum over its group."""
    hd = grad.shape[1] // n_heads
    q, k, v = grad.split(n_heads * hd)
    group = n_heads // n_kv_heads
    k, v = (t.view(n_kv_heads, group, hd, -1).sum(1).reshape(n_kv_heads * hd, -1) for t in (k, v))
    return torch.cat([q, k, v])


def as_multi_head(state: dict[str, torch.Tensor], n_heads: int, n_kv_heads: int
                  ) -> dict[str, torch.Tensor]:
    """A grouped-query LoopedLM state dict with every ``attn.qkv.weight`` repeated
    (:func:`repeated_kv`): the state of the KV = H model computing the same function."""
    return {k: repeated_kv(v, n_heads, n_kv_heads) if k.endswith("attn.qkv.weight") else v
            for k, v in state.items()}
