"""Causal self-attention that never crosses a document inside a packed row.

Two kernels share one mask object built once per batch (on the batch's device) and reused by
every layer and loop:
- ``sdpa``: ``F.scaled_dot_product_attention`` with a dense block-diagonal causal bool mask
  [B, 1, L, L]. The CPU default (deterministic, exact) and the fallback everywhere.
- ``flex``: compiled FlexAttention with a document block mask (:mod:`.flex`): ``auto`` picks
  it on CUDA, ``flex`` asks for it on any device. The first call decides once per process,
  after a probe against SDPA, whether the process runs flex or SDPA (a fallback is a warning
  and an MLflow tag, never a silent switch mid-run).

Grouped-query attention (``n_kv_heads`` < ``n_heads``): query head i reads key/value head
i // (n_heads / n_kv_heads), as in Llama; the kernels get the kv heads as they are
(``enable_gqa``) rather than copies repeated per group. On the CPU that forward is bit-equal
to repeating them, and faster forward and backward (``benchmarks/bench_gqa.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .flex import (
    decided_kernel,
    document_block_mask,
    flex_in_graph,
    flex_unavailable,
    pad_doc_ids,
    padded_length,
    run_flex,
    use_flex,
)
from .layers import RMSNorm, apply_rope

log = logging.getLogger(__name__)


class AttendsCached(Protocol):
    """What attention needs of a KV cache (:class:`~.kv_cache.KVCache`): keep this call's
    keys and values (the kv heads only), then attend over every cached one."""

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor: ...


def resolve_attention_kernel(requested: str, device: torch.device) -> str:
    """``auto``/``flex``/``sdpa`` → the kernel the masks of ``device`` are built for."""
    if requested == "sdpa" or (requested == "auto" and device.type != "cuda"):
        return "sdpa"
    if decided_kernel() == "sdpa":
        return "sdpa"
    try:
        # a probe: some torch builds (an accelerator's) lack FlexAttention
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        flex_unavailable("torch.nn.attention.flex_attention is not importable")
        return "sdpa"
    return "flex"


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
    block_mask: Any = None  # flex BlockMask over rows padded to ``flex_len``
    flex_len: int = 0
    _dense: Tensor | None = field(default=None, repr=False)

    @classmethod
    def build(cls, doc_ids: Tensor, kernel: str) -> DocumentMask:
        mask = cls(doc_ids=doc_ids, kernel=kernel)
        if kernel == "flex":
            mask.flex_len = padded_length(doc_ids.shape[1])
            mask.block_mask = document_block_mask(pad_doc_ids(doc_ids, mask.flex_len))
        return mask

    @property
    def dense(self) -> Tensor:
        if self._dense is None:
            self._dense = dense_document_mask(self.doc_ids)
        return self._dense


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """SDPA of q [B, H, L, hd] over k, v [B, KV, T, hd] (KV divides H) → [B, H, L, hd]."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          enable_gqa=k.shape[1] != q.shape[1])


def document_attention(q: Tensor, k: Tensor, v: Tensor, mask: DocumentMask) -> Tensor:
    """Attention of q [B, H, L, hd] over k, v [B, KV, L, hd] under the document mask →
    [B, H, L, hd]."""
    if mask.kernel == "flex" and torch.compiler.is_compiling():  # inside train.compile's graph
        return flex_in_graph(q, k, v, mask.block_mask, mask.flex_len)
    if mask.kernel == "flex" and use_flex(q, k.shape[1]):
        return run_flex(q, k, v, mask.block_mask, mask.flex_len)
    return sdpa(q, k, v, mask.dense)


class Attention(nn.Module):
    """Multi-head (or grouped-query) self-attention with RoPE and a fused q/k/v projection
    whose output rows are all q heads (H·hd), then all k heads (KV·hd), then all v heads
    (KV·hd); ``n_kv_heads`` 0 means KV = H, ``head_dim`` 0 means hd = dim / H.

    Options of pretrained families (all off by default): ``qkv_bias`` (Qwen2's q/k/v
    biases, the fused projection's bias), ``qk_norm`` — RMSNorm of queries and keys before
    RoPE, ``head`` (Qwen3: over each head's hd channels, one gain [hd] shared by the heads)
    or ``all_heads`` (OLMo-2: over all H·hd query channels and all KV·hd key channels)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int = 0, *, head_dim: int = 0,
                 qkv_bias: bool = False, qk_norm: str = "none", norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads or n_heads
        assert n_heads % self.n_kv_heads == 0, "config checks: n_kv_heads divides n_heads"
        self.head_dim = head_dim or dim // n_heads
        H, KV, hd = n_heads, self.n_kv_heads, self.head_dim
        self.qkv = nn.Linear(dim, (H + 2 * KV) * hd, bias=qkv_bias)
        self.out = nn.Linear(H * hd, dim, bias=False)
        self.qk_norm = qk_norm
        self.q_norm = self.k_norm = None
        if qk_norm != "none":
            per_head = qk_norm == "head"
            self.q_norm = RMSNorm(hd if per_head else H * hd, norm_eps)
            self.k_norm = RMSNorm(hd if per_head else KV * hd, norm_eps)

    def _projected(self, x: Tensor) -> Tensor:
        """qkv(x) [..., (H + 2KV)·hd], queries and keys normed when ``qk_norm`` asks."""
        qkv = self.qkv(x)
        if self.q_norm is None:
            return qkv
        H, KV, hd = self.n_heads, self.n_kv_heads, self.head_dim
        q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
        if self.qk_norm == "head":  # [..., heads, hd]: one gain for every head
            q = self.q_norm(q.unflatten(-1, (H, hd))).flatten(-2)
            k = self.k_norm(k.unflatten(-1, (KV, hd))).flatten(-2)
        else:
            q, k = self.q_norm(q), self.k_norm(k)
        return torch.cat((q, k, v), dim=-1)

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor],
                mask: DocumentMask | AttendsCached) -> Tensor:
        """x [B, L, D] → [B, L, D]; a decoding step passes x [B, D] (one token per row) and
        its KV cache as ``mask``."""
        if x.dim() == 2:
            assert not isinstance(mask, DocumentMask), "a [B, D] state decodes with a KV cache"
            return self._decode(x, rope, mask)
        B, L, D = x.shape  # batch, tokens, channels
        H, KV = self.n_heads, self.n_kv_heads
        qkv = self._projected(x).view(B, L, H + 2 * KV, self.head_dim)  # q, then k, then v
        # RoPE on the q and k heads in one go (the same arithmetic as one at a time, fewer ops)
        qk = apply_rope(qkv[:, :, : H + KV], *rope).transpose(1, 2)  # [B, H + KV, L, hd]
        q, k = qk.split((H, KV), dim=1)  # [B, H, L, hd], [B, KV, L, hd]
        v = qkv[:, :, H + KV:].transpose(1, 2)  # [B, KV, L, hd]
        if isinstance(mask, DocumentMask):
            y = document_attention(q, k, v, mask)  # [B, H, L, hd]
        else:  # a prefill: the KV cache (kv_cache.py) keeps k, v, then attends as above
            y = mask.attend(q, k, v)
        return self.out(y.transpose(1, 2).reshape(B, L, H * self.head_dim))

    def _decode(self, x: Tensor, rope: tuple[Tensor, Tensor], cache: AttendsCached) -> Tensor:
        """One new token per row, x [B, D]: the same arithmetic as :meth:`forward` on
        [B, 1, D], in the fewer operations a single token allows (decoding is bound by
        per-operation overhead, not arithmetic)."""
        B, _ = x.shape
        H, KV = self.n_heads, self.n_kv_heads
        qkv = self._projected(x).view(B, H + 2 * KV, 1, self.head_dim)  # [B, H + 2KV, 1, hd]
        q, k = apply_rope(qkv[:, : H + KV], *rope).split((H, KV), dim=1)  # rope: [B, 1, 1, hd]
        y = cache.attend(q, k, qkv[:, H + KV:])  # [B, H, 1, hd]
        return self.out(y.view(B, H * self.head_dim))
