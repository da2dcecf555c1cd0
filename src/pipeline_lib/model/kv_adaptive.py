"""Cached adaptive decoding: each token stops looping at its own exit, and its later loops
are never computed.

The exit decision comes from the caller (an :class:`ExitRule`: the evaluation's criteria,
:mod:`pipeline_lib.evaluate.exit.cached`), scored on the rows still looping after every loop
from their readout (coda, final norm, head). A decoding pass runs loop t on those rows only;
a row that exits at loop e keeps the logits of that readout, and the cache records e at its
column (:meth:`~.kv_cache.KVCache.exit_rows`). What a later token at loop t > e reads there
is ``kv_fill``:

- ``latest``: the keys and values of loop e, copied into the later loops' slots when the row
  exits (Huginn's ``generate_with_adaptive_compute`` default): no compute, a copy of
  (H − e) × core-block keys and values per exited token.
- ``skip``: the column is masked at loops past e: a later token attends to fewer positions at
  deep loops (one mask per loop per decoding pass, no copy).

The coda runs at every loop of a looping row (the criteria read its readout); its slots end
up holding each token's keys and values at its exit loop. The prompt is prefilled at full
depth (every position computes every loop in one parallel pass, the coda at every loop until
each row's last prompt token has exited, then once more at the end): only its last token's
readout, the first new token's, stops at its exit. With a threshold that never exits, both
passes compute exactly what fixed-depth cached decoding at ``max_loops`` computes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from .kv_cache import KVCache, decode_context, prefill_cache


class ExitRule(Protocol):
    """When a row stops looping; one pass at a time, over the rows still looping."""

    max_loops: int

    def start(self, state: Tensor, readout: Callable[[], Tensor]) -> None:
        """A pass begins: the initial state rows [a, D]; ``readout()`` → their logits."""

    def exited(self, state: Tensor, hidden: Tensor, logits: Tensor) -> Tensor:
        """After one more loop: bool [a], True where the row stops here."""

    def keep(self, still: Tensor) -> None:
        """Only the rows ``still`` [a] (bool) keep looping."""


def _rows_context(ctx: Any, rows: Tensor) -> Any:
    """``ctx`` of a decoding pass cut to ``rows`` (RoPE tables and the injected input)."""
    cos, sin = ctx.rope
    return type(ctx)(rope=(cos[rows], sin[rows]), mask=ctx.mask, targets=None,
                     answer_mask=None, e=ctx.e[rows])


def _readout(model: Any, cache: KVCache, state: Tensor, ctx: Any, rows: Tensor | None
             ) -> tuple[Tensor, Tensor]:
    cache.enter("coda", rows=rows)
    hidden = model.readout_hidden(state, ctx)
    return hidden, F.linear(hidden, model.head_weight)


@torch.inference_mode()
def kv_adaptive_step(model: Any, cache: KVCache, tokens: Tensor, rule: ExitRule
                     ) -> tuple[Tensor, Tensor]:
    """Append ``tokens`` [B]; (next-token logits [B, V] at each row's exit, loops [B])."""
    _, ctx = decode_context(model, cache, tokens)
    B, H = cache.rows, cache.h_eff
    state = cache.last_state if cache.continuous else model.init_state(ctx)
    rows = torch.arange(B, device=state.device)
    loops = torch.full((B,), H, dtype=torch.long, device=state.device)
    final = torch.empty_like(state)
    sub, part = ctx, None  # part: the rows still looping (None: all of them)
    rule.start(state, lambda: _readout(model, cache, state, ctx, None)[1])
    for t in range(H):
        cache.enter("loop", t, rows=part)
        state = model.forward_loops(sub, t, t + 1, state)
        hidden, logits = _readout(model, cache, state, sub, part)
        if t == 0:
            out = logits.new_empty((B, logits.shape[-1]))
        stop = torch.ones_like(rows, dtype=torch.bool) if t == H - 1 else \
            rule.exited(state, hidden, logits)
        out[rows[stop]], final[rows[stop]], loops[rows[stop]] = logits[stop], state[stop], t + 1
        if t == H - 1:
            break
        if bool(stop.any()):
            cache.exit_rows(rows[stop], t + 1)
            if bool(stop.all()):
                break
            still = ~stop
            rows, state, part = rows[still], state[still], rows[still]
            rule.keep(still)
            sub = _rows_context(ctx, part)
    cache.end_pass(final)
    return out, loops


@torch.inference_mode()
def kv_adaptive_prefill(model: Any, batch: Mapping[str, Tensor] | Tensor, rule: ExitRule,
                        lengths: Tensor | None = None, reserve: int = 0, **options: Any
                        ) -> tuple[Tensor, Tensor, KVCache]:
    """(logits [B, V] of each row's last prompt token at its exit, its loops [B], the
    cache at ``rule.max_loops``): the prompt computed at full depth (module doc)."""
    H = rule.max_loops
    ctx, lengths, cache = prefill_cache(model, batch, H, lengths, reserve, **options)
    B = len(lengths)
    at = torch.arange(B, device=lengths.device)
    state = model.init_state(ctx)
    loops = torch.full((B,), H, dtype=torch.long, device=lengths.device)
    looping = torch.ones(B, dtype=torch.bool, device=lengths.device)
    out = final = None
    rule.start(state[at, lengths - 1],
               lambda: _readout(model, cache, state, ctx, None)[1][at, lengths - 1])
    for t in range(H):
        cache.enter("loop", t)
        state = model.forward_loops(ctx, t, t + 1, state)
        if t < H - 1 and not bool(looping.any()):
            continue  # every row's last token has exited: no readout until the end
        hidden, logits = _readout(model, cache, state, ctx, None)
        last_h, last_logits, last_s = (x[at, lengths - 1] for x in (hidden, logits, state))
        if out is None:
            out, final = torch.empty_like(last_logits), torch.empty_like(last_s)
        if t == H - 1:
            out[looping], final[looping] = last_logits[looping], last_s[looping]
            break
        stop = torch.zeros_like(looping)
        stop[looping] = rule.exited(last_s[looping], last_h[looping], last_logits[looping])
        out[stop], final[stop], loops[stop] = last_logits[stop], last_s[stop], t + 1
        rule.keep(~stop[looping])
        looping &= ~stop
    cache.end_pass(final)
    return out, loops, cache
