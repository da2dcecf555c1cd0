"""KV cache for generation: the keys and values of every attention call, reused across steps.

The attention calls of one forward pass after H loops are, in order: the prelude blocks;
for each loop t = 1..H every core block (the same weights, but a different input each loop,
so each loop has keys and values of its own); the coda blocks of the readout at H. The
cache keeps one slot per call, [B, kv heads, capacity, head_dim] each: per loop, per core
block. A pass with the same H makes the same calls in the same order, which is how
:meth:`KVCache.attend` finds its slot (a counter, reset and checked per pass).

- :func:`kv_prefill`: one ordinary forward pass over right-padded rows (the computation of
  ``logits_at``, document mask and positions included), keeping every call's keys and
  values; row b's real tokens are its first ``lengths[b]``.
- :func:`kv_decode_step`: one new token per row, at column ``lengths[b]``, with position
  ``last position + 1`` and the document of the row's last token, attending to the cached
  columns of that document up to itself. Padding columns past a row's length are never
  attended; the row overwrites them as it grows. Buffers double when full.

A decoding pass carries the state as [B, D] (one token per row), which sends
:class:`~.attention.Attention` down its single-token path, and runs under
``torch.inference_mode``: at one token a step is a few hundred small operations, bound by
their per-call overhead rather than arithmetic, so every operation saved counts.

Exact against recomputing the whole window up to float rounding (matmuls of other shapes):
tests hold the logits within 1e-5 in fp32 and the greedy tokens identical. Adaptive exit
(every loop read out through the coda) is not cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import DocumentMask, document_attention, sdpa


def attention_calls(cfg: Any, h_eff: int) -> int:
    """Attention calls of one forward pass read out after ``h_eff`` loops."""
    return cfg.prelude_layers + h_eff * cfg.core_layers + cfg.coda_layers


def _grown(buf: Tensor, capacity: int, dim: int = 2, fill: float = 0.0) -> Tensor:
    """``buf`` with its column dim ``dim`` (2 for K/V [B, H, columns, hd], 3 for the mask
    bias) padded to ``capacity`` with ``fill``."""
    shape = list(buf.shape)
    shape[dim] = capacity - buf.shape[dim]
    return torch.cat([buf, buf.new_full(shape, fill)], dim=dim)


class KVCache:
    """Keys and values of every attention call of ``h_eff`` loops, per row (see module doc).

    A plain class, not a dataclass: FSDP's input casting must not copy it. Decoding attends
    through an additive mask ``bias`` [B, 1, 1, capacity] (0 where the next token may look,
    −inf elsewhere), kept up to date in place: a decoding step makes its own column visible.
    """

    def __init__(self, h_eff: int, calls: int, doc_mask: DocumentMask, doc_ids: Tensor,
                 positions: Tensor, lengths: Tensor, capacity: int) -> None:
        B, L = doc_ids.shape
        rows = torch.arange(B, device=doc_ids.device)
        self.h_eff, self.calls = h_eff, calls
        self.capacity = max(capacity, L)
        self.lengths = lengths.clone()  # [B] cached tokens = column of the next token
        self.positions = positions[rows, lengths - 1] + 1  # [B] position of the next token
        doc = doc_ids[rows, lengths - 1]  # [B] document the next token belongs to
        cols = torch.arange(L, device=doc_ids.device)
        visible = (cols[None] < lengths[:, None]) & (doc_ids == doc[:, None])  # [B, L]
        bias = torch.zeros(B, 1, 1, L, device=doc_ids.device).masked_fill_(
            ~visible[:, None, None], float("-inf"))
        self.bias = _grown(bias, self.capacity, 3, float("-inf"))  # [B, 1, 1, capacity]
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self._prefill_mask: DocumentMask | None = doc_mask
        self._column: Tensor | None = None  # decoding: [B, KV, 1, hd] index of the new column
        self._visible: Tensor | None = None  # decoding: the bias up to the longest row's token
        self._slot = 0

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store k, v [B, KV, L, hd] in this call's slot; attention of q [B, H, L, hd] →
        [B, H, L, hd] (KV < H: grouped-query attention, only the kv heads are cached)."""
        slot = self._slot
        self._slot += 1
        if self._prefill_mask is not None:  # prefill: keep the keys and values, attend as usual
            assert slot == len(self.keys), "prefill runs each attention call once"
            if slot == 0:
                self.bias = self.bias.to(k.dtype)  # SDPA wants the mask in the query's dtype
            self.keys.append(_grown(k, self.capacity))
            self.values.append(_grown(v, self.capacity))
            return document_attention(q, k, v, self._prefill_mask)
        keys, values = self.keys[slot], self.values[slot]
        keys.scatter_(2, self._column, k.to(keys.dtype))
        values.scatter_(2, self._column, v.to(values.dtype))
        used = self._visible.shape[-1]  # later columns are never visible: skip them
        return sdpa(q, keys[:, :, :used], values[:, :, :used], self._visible)

    def begin_step(self) -> None:
        """Before a decoding pass: room for one more column, made visible to its row."""
        needed = int(self.lengths.max()) + 1
        if needed > self.capacity:
            capacity = max(needed, 2 * self.capacity)
            self.keys = [_grown(t, capacity) for t in self.keys]
            self.values = [_grown(t, capacity) for t in self.values]
            self.bias = _grown(self.bias, capacity, 3, float("-inf"))
            self.capacity = capacity
        column = self.lengths.view(-1, 1, 1, 1)
        self.bias.scatter_(3, column, 0.0)
        self._visible = self.bias[..., :needed]
        _, heads, _, head_dim = self.keys[0].shape
        self._column = column.expand(-1, heads, 1, head_dim)
        self._slot = 0

    def end_pass(self) -> None:
        """After a pass: every slot was used once; a decoding pass moves each row on."""
        assert self._slot == self.calls, f"{self._slot} attention calls, cache has {self.calls}"
        if self._prefill_mask is None:
            self.lengths += 1
            self.positions += 1
        self._prefill_mask = None  # every pass after the prefill decodes

    @torch.inference_mode()
    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows, in the new order)."""
        rows = rows.to(self.lengths.device)
        self.keys = [t.index_select(0, rows) for t in self.keys]
        self.values = [t.index_select(0, rows) for t in self.values]
        for name in ("lengths", "positions", "bias"):
            setattr(self, name, getattr(self, name).index_select(0, rows))


@torch.inference_mode()
def kv_prefill(model: Any, batch: Mapping[str, Tensor] | Tensor, h_eff: int,
               lengths: Tensor | None = None, reserve: int = 0) -> tuple[Tensor, KVCache]:
    """Logits [B, V] at each row's last real token after ``h_eff`` loops, and the cache.

    ``batch``: input ids [B, L] or a batch dict (``position_ids``/``doc_ids`` honoured as
    the model does); ``lengths`` [B] real tokens per right-padded row (default L);
    ``reserve``: extra columns allocated up front (the cache grows by doubling anyway).
    """
    if h_eff < 1:
        raise ValueError(f"h_eff must be at least 1, got {h_eff}")
    batch = {"input_ids": batch} if isinstance(batch, Tensor) else dict(batch)
    ids = batch["input_ids"]
    B, L = ids.shape
    dev = ids.device
    lengths = (torch.full((B,), L, dtype=torch.long, device=dev) if lengths is None
               else torch.as_tensor(lengths, dtype=torch.long, device=dev))
    if lengths.shape != (B,) or int(lengths.min()) < 1 or int(lengths.max()) > L:
        raise ValueError(f"lengths must hold {B} values in 1..{L}, got {lengths.tolist()}")
    positions = batch.get("position_ids")
    if positions is None:
        positions = torch.arange(L, device=dev).expand(B, L)
    doc_ids = batch.get("doc_ids")
    if doc_ids is None:
        doc_ids = torch.zeros_like(ids)
    ctx = model.context(batch)
    cache = KVCache(h_eff, attention_calls(model.cfg, h_eff), ctx.mask, doc_ids, positions,
                    lengths, L + max(reserve, 0))
    ctx.mask = cache
    state = model.forward_loops(model.embed(batch, ctx), 0, h_eff)
    hidden = model.readout_hidden(state, ctx)  # [B, L, D]
    cache.end_pass()
    last = hidden[torch.arange(B, device=dev), lengths - 1]  # [B, D]
    return F.linear(last, model.head_weight), cache


@torch.inference_mode()
def kv_decode_step(model: Any, cache: KVCache, tokens: Tensor) -> Tensor:
    """Append ``tokens`` [B] (one per row) and return the next-token logits [B, V]."""
    tokens = torch.as_tensor(tokens, device=cache.lengths.device).reshape(-1, 1)
    if tokens.shape[0] != cache.rows:
        raise ValueError(f"decode_step got {tokens.shape[0]} tokens for {cache.rows} rows")
    cache.begin_step()
    ctx = model.context({"input_ids": tokens, "position_ids": cache.positions[:, None]},
                        mask=cache)  # RoPE tables [B, 1, 1, hd]
    # The state is [B, D], one token per row: attention takes its decoding path.
    state = model.forward_loops(model.embed(tokens[:, 0], ctx), 0, cache.h_eff)
    logits = model.readout_logits(state, ctx)  # [B, V]
    cache.end_pass()
    return logits
