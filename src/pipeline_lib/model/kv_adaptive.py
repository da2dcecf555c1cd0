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

A loop's readout (coda, final norm, head) is computed only as far as the rule reads it
(``ExitRule.reads``): ``logits`` (kl, entropy, argmax_stable) the whole readout of every
looping row after every loop; ``hidden`` (the learned gate) the coda and norm, the head only
for the rows that exit; ``state`` (latent_diff, cosine) nothing until a row exits, then its
readout alone. The coda's slots end up holding each token's keys and values at its exit
loop either way (a looping row's coda writes are overwritten until its exit, and no other
row of a decoding pass reads them), so the three give the same numbers; ``state`` saves
every coda and head call before the exit. The prompt is prefilled at full depth (every
position computes every loop in one parallel pass; the whole prompt is read out at the loops
where the rule reads a readout or a row's last prompt token exits, and once more at the end,
the head only on each row's last token): only its last token's readout, the first new
token's, stops at its exit. With a threshold that never exits, both passes compute exactly
what fixed-depth cached decoding at ``max_loops`` computes.
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
    reads: str  # what exited() reads after a loop: "state", "hidden" or "logits"

    def start(self, state: Tensor, readout: Callable[[], Tensor]) -> None:
        """A pass begins: the initial state rows [a, D]; ``readout()`` → their logits."""

    def exited(self, state: Tensor, hidden: Tensor | None, logits: Tensor | None) -> Tensor:
        """After one more loop: bool [a], True where the row stops here (``hidden`` and
        ``logits`` given as far as ``reads`` asks)."""

    def keep(self, still: Tensor) -> None:
        """Only the rows ``still`` [a] (bool) keep looping."""


def _rows_context(ctx: Any, rows: Tensor) -> Any:
    """``ctx`` of a decoding pass cut to ``rows`` (RoPE tables and the injected input)."""
    cos, sin = ctx.rope
    return type(ctx)(rope=(cos[rows], sin[rows]), mask=ctx.mask, targets=None,
                     answer_mask=None, e=ctx.e[rows])


def _hidden(model: Any, cache: KVCache, state: Tensor, ctx: Any, rows: Tensor | None
            ) -> Tensor:
    """norm(coda(state)) of the cache rows ``rows`` (None: all), the coda's slots written."""
    cache.enter("coda", rows=rows)
    return model.readout_hidden(state, ctx)


def _head(model: Any, hidden: Tensor) -> Tensor:
    return F.linear(hidden, model.head_weight)


def _loop_readout(model: Any, cache: KVCache, rule: ExitRule, state: Tensor, sub: Any,
                  part: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
    """(hidden, logits) of the looping rows after a loop, as far as ``rule.reads`` asks."""
    if rule.reads == "state":
        return None, None
    hidden = _hidden(model, cache, state, sub, part)
    return hidden, (_head(model, hidden) if rule.reads == "logits" else None)


def _exit_logits(model: Any, cache: KVCache, state: Tensor, ctx: Any, rows: Tensor,
                 stop: Tensor, sub: Any, part: Tensor | None,
                 read: tuple[Tensor | None, Tensor | None]) -> Tensor:
    """Logits of the looping rows that ``stop`` [a] (rows: their cache rows [a]), from this
    loop's ``read`` where it has them, else read out now (those rows alone)."""
    hidden, logits = read
    if logits is not None:
        return logits[stop]
    if hidden is not None:
        return _head(model, hidden[stop])
    if bool(stop.all()):
        return _head(model, _hidden(model, cache, state, sub, part))
    return _head(model, _hidden(model, cache, state[stop], _rows_context(ctx, rows[stop]),
                                rows[stop]))


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
    out: Tensor | None = None
    sub, part = ctx, None  # part: the rows still looping (None: all of them)
    rule.start(state, lambda: _head(model, _hidden(model, cache, state, ctx, None)))
    for t in range(H):
        cache.enter("loop", t, rows=part)
        state = model.forward_loops(sub, t, t + 1, state)
        last = t == H - 1
        read = (None, None) if last else _loop_readout(model, cache, rule, state, sub, part)
        stop = torch.ones_like(rows, dtype=torch.bool) if last else rule.exited(state, *read)
        if not bool(stop.any()):
            continue
        logits = _exit_logits(model, cache, state, ctx, rows, stop, sub, part, read)
        if out is None:
            out = logits.new_empty((B, logits.shape[-1]))
        out[rows[stop]], final[rows[stop]], loops[rows[stop]] = logits, state[stop], t + 1
        if not last:
            cache.exit_rows(rows[stop], t + 1)
        if last or bool(stop.all()):
            break
        still = ~stop
        rows, state, part = rows[still], state[still], rows[still]
        rule.keep(still)
        sub = _rows_context(ctx, part)
    cache.end_pass(final)
    assert out is not None
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
               lambda: _head(model, _hidden(model, cache, state, ctx, None)[at, lengths - 1]))
    for t in range(H):
        cache.enter("loop", t)
        state = model.forward_loops(ctx, t, t + 1, state)
        last = t == H - 1
        if not last and not bool(looping.any()):
            continue  # every row's last token has exited: no readout until the end
        last_s = state[at, lengths - 1]
        stop = torch.zeros_like(looping)
        hidden = None
        if last:
            stop = looping.clone()
        elif rule.reads == "state":
            stop[looping] = rule.exited(last_s[looping], None, None)
        else:
            hidden = _hidden(model, cache, state, ctx, None)[at, lengths - 1]
            logits = _head(model, hidden) if rule.reads == "logits" else None
            stop[looping] = rule.exited(last_s[looping], hidden[looping],
                                        None if logits is None else logits[looping])
        if hidden is None and (last or bool(stop.any())):  # the whole prompt at this loop
            hidden = _hidden(model, cache, state, ctx, None)[at, lengths - 1]
        if bool(stop.any()):
            exit_logits = _head(model, hidden[stop])
            if out is None:
                out = exit_logits.new_empty((B, exit_logits.shape[-1]))
                final = torch.empty_like(last_s)
            out[stop], final[stop], loops[stop] = exit_logits, last_s[stop], t + 1
        if last:
            break
        rule.keep(~stop[looping])
        looping &= ~stop
    cache.end_pass(final)
    return out, loops, cache
