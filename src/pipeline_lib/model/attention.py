"""Causal self-attention that never crosses a document inside a packed row.

Two kernels share one mask object built once per batch and reused by every layer and loop:
- ``sdpa``: ``F.scaled_dot_product_attention`` with a dense block-diagonal causal bool mask
  [B, 1, L, L]. Used on the CPU (deterministic, exact) and as the fallback everywhere.
- ``flex``: FlexAttention with a document block mask (CUDA only). Block sparsity skips the
  cross-document tiles instead of masking them. Any failure to build or run it (no Triton,
  an unsupported GPU, a compile error) logs one warning and switches the process to SDPA.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import apply_rope

log = logging.getLogger(__name__)

_flex_state: dict[str, Any] = {"disabled": False, "compiled": None}


def resolve_attention_kernel(requested: str, device: torch.device) -> str:
    """``auto``/``flex``/``sdpa`` → the kernel actually used on ``device``."""
    if requested == "sdpa" or _flex_state["disabled"]:
        return "sdpa"
    if device.type != "cuda":
        if requested == "flex":
            log.warning("model.attention = flex needs CUDA; using sdpa on %s", device.type)
        return "sdpa"
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        _disable_flex("torch.nn.attention.flex_attention is not importable")
        return "sdpa"
    return "flex"


def _disable_flex(reason: str) -> None:
    if not _flex_state["disabled"]:
        log.warning("FlexAttention unavailable (%s); falling back to SDPA with a dense mask",
                    reason)
    _flex_state["disabled"] = True


def dense_document_mask(doc_ids: Tensor) -> Tensor:
    """[B, L] document ids → [B, 1, L, L] bool, True where query i may attend to key j.

    j ≤ i (causal) and doc_ids[j] == doc_ids[i]; every token attends at least to itself, so
    no row is fully masked (padding with its own id stays finite).
    """
    L = doc_ids.shape[1]
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]  # [B, L, L]
    causal = torch.ones(L, L, dtype=torch.bool, device=doc_ids.device).tril()
    return (same_doc & causal)[:, None]


@dataclass
class DocumentMask:
    """The attention mask of one batch, in the form its kernel wants."""

    doc_ids: Tensor  # [B, L]
    kernel: str  # "sdpa" or "flex"
    block_mask: Any = None  # flex BlockMask
    _dense: Tensor | None = field(default=None, repr=False)

    @classmethod
    def build(cls, doc_ids: Tensor, kernel: str) -> DocumentMask:
        mask = cls(doc_ids=doc_ids, kernel=kernel)
        if kernel == "flex":
            try:
                mask.block_mask = _flex_block_mask(doc_ids)
            except Exception as exc:  # any build failure means: use the dense path
                _disable_flex(f"create_block_mask failed: {exc}".splitlines()[0])
                mask.kernel = "sdpa"
        return mask

    @property
    def dense(self) -> Tensor:
        if self._dense is None:
            self._dense = dense_document_mask(self.doc_ids)
        return self._dense


def _flex_block_mask(doc_ids: Tensor) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    def document_causal(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (doc_ids[b, q] == doc_ids[b, kv]) & (kv <= q)

    B, L = doc_ids.shape
    return create_block_mask(document_causal, B, None, L, L, device=doc_ids.device)


def _flex_attention(q: Tensor, k: Tensor, v: Tensor, block_mask: Any) -> Tensor:
    if _flex_state["compiled"] is None:
        from torch.nn.attention.flex_attention import flex_attention

        _flex_state["compiled"] = torch.compile(flex_attention, dynamic=False)
    return _flex_state["compiled"](q, k, v, block_mask=block_mask)


def document_attention(q: Tensor, k: Tensor, v: Tensor, mask: DocumentMask) -> Tensor:
    """Attention of q, k, v [B, H, L, hd] under the document mask → [B, H, L, hd]."""
    if mask.kernel == "flex" and not _flex_state["disabled"]:
        try:
            return _flex_attention(q, k, v, mask.block_mask)
        except Exception as exc:  # fall back for the rest of the process
            _disable_flex(f"flex_attention failed: {exc}".splitlines()[0])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense)


class Attention(nn.Module):
    """Multi-head self-attention with RoPE; fused q/k/v projection, no biases."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor], mask: DocumentMask) -> Tensor:
        B, L, D = x.shape  # batch, tokens, channels
        qkv = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim)
        q, k, v = qkv.unbind(2)  # each [B, L, H, hd]; RoPE here, where rows are contiguous
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, L, hd]
        if isinstance(mask, DocumentMask):
            y = document_attention(q, k, v, mask)  # [B, H, L, hd]
        else:  # generation: a KV cache (kv_cache.py) stores k, v and attends over its rows
            y = mask.attend(q, k, v)
        return self.out(y.transpose(1, 2).reshape(B, L, D))
