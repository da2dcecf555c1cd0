"""KV cache for generation: the keys and values of every attention call, reused across steps.

The attention calls of one forward pass after H loops are, in order: the prelude blocks;
for each loop t = 1..H every core block (the same weights, but a different input each loop,
so each loop has keys and values of its own); the coda blocks of the readout at H. The
cache keeps one slot per prelude and coda block and, per core block, one slot per group of
loops, [B, kv heads, capacity, head_dim] each. Before each piece of a pass the driver names
it (:meth:`KVCache.enter`: prelude, loop t, coda) and the piece's attention calls take that
piece's slots in order.

``kv_share`` (:func:`share_every`) chooses the groups of loops (Mixture-of-Recursions' and
Ouro's KV sharing across recursions):

- ``per_loop`` (default): one slot per loop, exact (bit for bit what a cache of every loop
  gives).
- ``last``: one slot for all loops, holding each earlier position's keys and values of its
  last loop; a new token at loop t attends to those and to its own keys and values of loop
  t. The core's slots take 1/H of the memory.
- ``every:k``: one slot per k loops (loops 1..k, k+1..2k, …), holding the group's last loop.
  ``every:1`` is ``per_loop``; ``every:H`` is ``last``.

The prefill computes the prompt exactly (every position attends to the others' keys and
values of the same loop) and keeps each group's last loop; sharing changes what the
generated tokens see. :attr:`KVCache.nbytes` is the memory its keys and values take,
:attr:`KVCache.nbytes_core` the core slots' part of it: ``last`` keeps exactly 1/H of
``per_loop``'s core bytes, and (P + C + Q)/(P + H·C + Q) of its total with P prelude, C core
and Q coda blocks.

- :func:`kv_prefill`: one ordinary forward pass over right-padded rows (the computation of
  ``logits_at``, document mask and positions included), keeping every call's keys and
  values; row b's real tokens are its first ``lengths[b]``.
- :func:`kv_decode_step`: one new token per row, at column ``lengths[b]``, with position
  ``last position + 1`` and the document of the row's last token, attending to the cached
  columns of that document up to itself. Padding columns past a row's length are never
  attended; the row overwrites them as it grows. Buffers double when full.
- Adaptive exit, per-token exits and ``kv_fill`` (what a later token reads of a position
  that stopped looping early): :mod:`.kv_adaptive`, over :meth:`KVCache.exit_rows`.
- ``continuous``: a decoded token starts its loops from the previous token's final state
  (Huginn's continuous compute) instead of ``state_init``; :attr:`KVCache.last_state`.

A decoding pass carries the state as [B, D] (one token per row), which sends
:class:`~.attention.Attention` down its single-token path, and runs under
``torch.inference_mode``: at one token a step is a few hundred small operations, bound by
their per-call overhead rather than arithmetic, so every operation saved counts.

Exact against recomputing the whole window up to float rounding (matmuls of other shapes):
tests hold the logits within 1e-5 in fp32 and the greedy tokens identical (``per_loop``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..spec.rules import KV_FILLS
from .attention import DocumentMask, document_attention, sdpa

KV_SHARES = "per_loop, last or every:K (K >= 1)"


def share_every(kv_share: str, loops: int, key: str = "--kv-share") -> int:
    """Loops per core slot of ``kv_share`` at ``loops`` loops (see the module doc)."""
    text = str(kv_share).strip().lower()
    if text == "per_loop":
        return 1
    if text == "last":
        return max(int(loops), 1)
    head, _, k = text.partition(":")
    if head == "every" and k.strip().isdigit() and int(k) >= 1:
        return int(k)
    raise ConfigError(f"{key} {kv_share!r} is not one of {KV_SHARES}; use e.g. {key} last "
                      f"or {key} every:2")


def check_kv_fill(kv_fill: str, key: str = "--kv-fill") -> str:
    """``kv_fill`` if it is one of :data:`KV_FILLS`."""
    if kv_fill not in KV_FILLS:
        raise ConfigError(f"{key} {kv_fill!r} is not one of {list(KV_FILLS)}; use {key} latest "
                          "(a stopped position's last loop) or skip (masked past it)")
    return kv_fill


def attention_calls(cfg: Any, h_eff: int) -> int:
    """Attention calls of one forward pass read out after ``h_eff`` loops."""
    return cfg.prelude_layers + h_eff * cfg.core_layers + cfg.coda_layers


def _grown(buf: Tensor, capacity: int, dim: int = 2, fill: float = 0.0) -> Tensor:
    """``buf`` with its column dim ``dim`` (2 for K/V [B, H, columns, hd], 3 for the mask
    bias, 1 for ``reached``) padded to ``capacity`` with ``fill``."""
    shape = list(buf.shape)
    shape[dim] = capacity - buf.shape[dim]
    return torch.cat([buf, buf.new_full(shape, fill)], dim=dim)


def _bytes(*slots: list[Tensor]) -> int:
    return sum(t.numel() * t.element_size() for group in slots for t in group if t is not None)


class KVCache:
    """Keys and values of the attention calls of ``h_eff`` loops, per row (see module doc).

    A plain class, not a dataclass: FSDP's input casting must not copy it. Decoding attends
    through an additive mask ``bias`` [B, 1, 1, capacity] (0 where the next token may look,
    −inf elsewhere), kept up to date in place: a decoding step makes its own column visible.
    ``reached`` [B, capacity]: loops computed at each column (``h_eff`` unless the token
    exited early); ``kv_fill`` ``skip`` masks a column at the loops past it.
    """

    def __init__(self, h_eff: int, cfg: Any, doc_mask: DocumentMask, doc_ids: Tensor,
                 positions: Tensor, lengths: Tensor, capacity: int, *, kv_share: str = "per_loop",
                 kv_fill: str = "latest", continuous: bool = False) -> None:
        B, L = doc_ids.shape
        rows = torch.arange(B, device=doc_ids.device)
        self.h_eff, self.kv_share, self.kv_fill = h_eff, kv_share, check_kv_fill(kv_fill)
        self.every = share_every(kv_share, h_eff)
        groups = -(-h_eff // self.every)
        self.prelude, self.core = cfg.prelude_layers, cfg.core_layers
        self.coda_slot = self.prelude + groups * self.core  # first coda slot
        self.calls = self.coda_slot + cfg.coda_layers  # slots
        self.continuous = continuous
        self.capacity = max(capacity, L)
        self.lengths = lengths.clone()  # [B] cached tokens = column of the next token
        self.positions = positions[rows, lengths - 1] + 1  # [B] position of the next token
        doc = doc_ids[rows, lengths - 1]  # [B] document the next token belongs to
        cols = torch.arange(L, device=doc_ids.device)
        visible = (cols[None] < lengths[:, None]) & (doc_ids == doc[:, None])  # [B, L]
        bias = torch.zeros(B, 1, 1, L, device=doc_ids.device).masked_fill_(
            ~visible[:, None, None], float("-inf"))
        self.bias = _grown(bias, self.capacity, 3, float("-inf"))  # [B, 1, 1, capacity]
        self.reached = torch.full((B, self.capacity), h_eff, dtype=torch.long,
                                  device=doc_ids.device)
        self.keys: list[Tensor] = [None] * self.calls  # type: ignore[list-item]
        self.values: list[Tensor] = [None] * self.calls  # type: ignore[list-item]
        self.last_state: Tensor | None = None  # [B, D] final state of each row's last token
        self._prefill_mask: DocumentMask | None = doc_mask
        self._column: Tensor | None = None  # decoding: [B, KV, 1, hd] index of the new column
        self._visible: Tensor | None = None  # decoding: the bias up to the longest row's token
        self._mask: Tensor | None = None  # decoding: the bias of the current piece's rows
        self._rows: Tensor | None = None  # decoding: the rows computed (None: all)
        self._skipped = False  # kv_fill skip: some column stopped before the last loop
        self._slot = 0

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes of the cached keys and values (every slot, at its allocated capacity)."""
        return _bytes(self.keys, self.values)

    @property
    def nbytes_core(self) -> int:
        """Bytes of the core blocks' slots alone (what ``kv_share`` shrinks: ``last`` keeps
        1/H of ``per_loop``'s); :attr:`nbytes` adds one slot per prelude and coda block."""
        core = slice(self.prelude, self.coda_slot)
        return _bytes(self.keys[core], self.values[core])

    def group_slot(self, t: int) -> int:
        """First slot of the core blocks at loop t (0-based)."""
        return self.prelude + (t // self.every) * self.core

    def enter(self, piece: str, t: int = 0, rows: Tensor | None = None) -> None:
        """Before a piece of a pass (``prelude``, ``loop`` t (0-based), ``coda``): its
        attention calls take its slots; a decoding piece computes only ``rows`` (None: all)."""
        self._slot = (self.group_slot(t) if piece == "loop" else
                      self.coda_slot if piece == "coda" else 0)
        if self._prefill_mask is not None:
            return
        self._rows = rows
        mask = self._visible
        if piece == "loop" and self._skipped:  # stopped before loop t+1: masked
            used = mask.shape[-1]
            mask = mask.masked_fill((self.reached[:, None, None, :used] <= t), float("-inf"))
        self._mask = mask if rows is None else mask[rows]

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Store k, v [B, KV, L, hd] in this call's slot; attention of q [B, H, L, hd] →
        [B, H, L, hd] (KV < H: grouped-query attention, only the kv heads are cached)."""
        slot = self._slot
        self._slot += 1
        if self._prefill_mask is not None:  # prefill: keep the keys and values, attend as usual
            if self.keys[slot] is None and self.bias.dtype != k.dtype:
                self.bias = self.bias.to(k.dtype)  # SDPA wants the mask in the query's dtype
            self.keys[slot] = _grown(k, self.capacity)  # a group's later loop replaces it
            self.values[slot] = _grown(v, self.capacity)
            return document_attention(q, k, v, self._prefill_mask)
        keys, values = self.keys[slot], self.values[slot]
        used = self._visible.shape[-1]  # later columns are never visible: skip them
        if self._rows is None:
            keys.scatter_(2, self._column, k.to(keys.dtype))
            values.scatter_(2, self._column, v.to(values.dtype))
            return sdpa(q, keys[:, :, :used], values[:, :, :used], self._mask)
        rows, cols = self._rows, self.lengths[self._rows]
        keys[rows, :, cols] = k[:, :, 0].to(keys.dtype)
        values[rows, :, cols] = v[:, :, 0].to(values.dtype)
        return sdpa(q, keys[rows, :, :used], values[rows, :, :used], self._mask)

    def exit_rows(self, rows: Tensor, loops: int) -> None:
        """Rows whose new token stopped after ``loops`` loops: ``reached`` records it; under
        ``kv_fill`` ``latest`` the later groups' slots get its keys and values of that loop."""
        cols = self.lengths[rows]
        self.reached[rows, cols] = loops
        if self.kv_fill != "latest":
            self._skipped = True  # from now on a loop may mask columns
            return
        src = self.group_slot(loops - 1)
        for dst in range(src + self.core, self.group_slot(self.h_eff - 1) + 1, self.core):
            for j in range(self.core):
                for buf in (self.keys, self.values):
                    buf[dst + j][rows, :, cols] = buf[src + j][rows, :, cols]

    def begin_step(self) -> None:
        """Before a decoding pass: room for one more column, made visible to its row."""
        needed = int(self.lengths.max()) + 1
        if needed > self.capacity:
            capacity = max(needed, 2 * self.capacity)
            self.keys = [_grown(t, capacity) for t in self.keys]
            self.values = [_grown(t, capacity) for t in self.values]
            self.bias = _grown(self.bias, capacity, 3, float("-inf"))
            self.reached = _grown(self.reached, capacity, 1, self.h_eff)
            self.capacity = capacity
        column = self.lengths.view(-1, 1, 1, 1)
        self.bias.scatter_(3, column, 0.0)
        self.reached.scatter_(1, self.lengths[:, None], self.h_eff)
        self._visible = self.bias[..., :needed]
        _, heads, _, head_dim = self.keys[0].shape
        self._column = column.expand(-1, heads, 1, head_dim)

    def end_pass(self, last_state: Tensor | None = None) -> None:
        """After a pass (``last_state`` [B, D]: each row's final state, kept for continuous
        compute): every slot is filled; a decoding pass moves each row on."""
        assert all(t is not None for t in self.keys), "a pass left cache slots empty"
        if self.continuous:
            assert last_state is not None, "continuous compute needs the final states"
            self.last_state = last_state
        if self._prefill_mask is None:
            self.lengths += 1
            self.positions += 1
        self._prefill_mask = None  # every pass after the prefill decodes
        self._rows = None

    @torch.inference_mode()
    def select(self, rows: Tensor) -> None:
        """Keep only ``rows`` (indices into the current rows, in the new order)."""
        rows = rows.to(self.lengths.device)
        self.keys = [t.index_select(0, rows) for t in self.keys]
        self.values = [t.index_select(0, rows) for t in self.values]
        for name in ("lengths", "positions", "bias", "reached", "last_state"):
            if getattr(self, name) is not None:
                setattr(self, name, getattr(self, name).index_select(0, rows))


def prefill_cache(model: Any, batch: Mapping[str, Tensor] | Tensor, h_eff: int,
                  lengths: Tensor | None, reserve: int, **options: Any
                  ) -> tuple[Any, Tensor, KVCache]:
    """(context attending through the cache, lengths [B], the empty cache) of a prefill;
    ``options``: the cache's ``kv_share``, ``kv_fill`` and ``continuous``."""
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
    cache = KVCache(h_eff, model.cfg, ctx.mask, doc_ids, positions, lengths,
                    L + max(reserve, 0), **options)
    ctx.mask = cache
    cache.enter("prelude")
    return model.embed(batch, ctx), lengths, cache


def run_loops(model: Any, cache: KVCache, ctx: Any, state: Tensor | None, start: int, end: int
              ) -> Tensor:
    """Loops start+1 … end of ``ctx`` through the cache, each in its own slots."""
    for t in range(start, end):
        cache.enter("loop", t)
        state = model.forward_loops(ctx, t, t + 1, state)
    assert state is not None
    return state


@torch.inference_mode()
def kv_prefill(model: Any, batch: Mapping[str, Tensor] | Tensor, h_eff: int,
               lengths: Tensor | None = None, reserve: int = 0, **options: Any
               ) -> tuple[Tensor, KVCache]:
    """Logits [B, V] at each row's last real token after ``h_eff`` loops, and the cache.

    ``batch``: input ids [B, L] or a batch dict (``position_ids``/``doc_ids`` honoured as
    the model does); ``lengths`` [B] real tokens per right-padded row (default L);
    ``reserve``: extra columns allocated up front (the cache grows by doubling anyway);
    ``options``: ``kv_share``, ``kv_fill``, ``continuous`` (see the module doc).
    """
    ctx, lengths, cache = prefill_cache(model, batch, h_eff, lengths, reserve, **options)
    state = run_loops(model, cache, ctx, None, 0, h_eff)
    cache.enter("coda")
    hidden = model.readout_hidden(state, ctx)  # [B, L, D]
    at = torch.arange(len(lengths), device=lengths.device)
    cache.end_pass(state[at, lengths - 1])
    return F.linear(hidden[at, lengths - 1], model.head_weight), cache


def decode_context(model: Any, cache: KVCache, tokens: Tensor) -> tuple[Tensor, Any]:
    """(tokens [B, 1], embedded context) of a decoding pass; the cache made ready."""
    tokens = torch.as_tensor(tokens, device=cache.lengths.device).reshape(-1, 1)
    if tokens.shape[0] != cache.rows:
        raise ValueError(f"decode_step got {tokens.shape[0]} tokens for {cache.rows} rows")
    cache.begin_step()
    ctx = model.context({"input_ids": tokens, "position_ids": cache.positions[:, None]},
                        mask=cache)  # RoPE tables [B, 1, 1, hd]
    cache.enter("prelude")
    return tokens, model.embed(tokens[:, 0], ctx)  # the state is [B, D]: decoding path


@torch.inference_mode()
def kv_decode_step(model: Any, cache: KVCache, tokens: Tensor) -> Tensor:
    """Append ``tokens`` [B] (one per row) and return the next-token logits [B, V]."""
    tokens, ctx = decode_context(model, cache, tokens)
    state = run_loops(model, cache, ctx, cache.last_state if cache.continuous else None,
                      0, cache.h_eff)
    cache.enter("coda")
    logits = model.readout_logits(state, ctx)  # [B, V]
    cache.end_pass(state)
    return logits
