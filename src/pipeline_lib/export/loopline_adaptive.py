"""Adaptive depth of the exported loopline model under its exit gate (remote code: torch only).

Copied next to ``modeling_loopline.py`` by ``python -m pipeline_lib export`` and imported by
it relatively. Loopline's cached adaptive decoding (its ``model/kv_adaptive.py``,
criterion ``gate``) redone for the export, with the same results:

- :func:`full_depth_readout`: every position of the pass runs every loop (later tokens of the
  same pass attend to its state at each); each is read out at its gate exit loop. Without a
  cache this is loopline's ``adaptive_logits``; through an :class:`AdaptiveKVCache` it is the
  prompt's prefill (``kv_adaptive_prefill``): each loop's core keys and values are kept, the
  coda's of the last loop only (a pass of several tokens over a filled cache runs the same
  way, attending to the cached positions as a decoding step does).
- :func:`adaptive_step`: one new token per row over a filled cache; a row stops at its gate
  exit loop, and its later loops (core blocks and the coda readouts after them) are never
  computed (``kv_adaptive_step``).

What a later token at loop t reads of a column that stopped at loop e < t is ``kv_fill``:
``latest`` (default) copies the column's keys and values of loop e into the later loops'
slots when it stops; ``skip`` masks the column at loops past e. The coda slots hold every
column's keys and values of its exit loop (of the last loop for the prompt).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from .loopline_layers import LoopKVCache

KV_FILLS = ("latest", "skip")


def check_kv_fill(kv_fill: object) -> str:
    """``kv_fill`` if it is one of :data:`KV_FILLS`; a ValueError naming them otherwise."""
    if kv_fill not in KV_FILLS:
        raise ValueError(f"kv_fill={kv_fill!r} is not one of {list(KV_FILLS)}; use "
                         "kv_fill='latest' (a stopped position's last loop, the default) or "
                         "kv_fill='skip' (masked at the loops it did not reach)")
    return str(kv_fill)


class AdaptiveKVCache(LoopKVCache):
    """:class:`LoopKVCache` of a pass under the exit gate: one slot per prelude block, per
    core block and loop, per coda block; ``reached`` [B, T] the loops each cached column
    computed, ``exit_loops`` [B, T] the loop it was read out at (column j's exit loop is
    the depth that predicted token j + 1). See the module doc for what fills the slots."""

    gated = True

    def __init__(self, num_loops: int, config: PretrainedConfig,
                 kv_fill: str = "latest") -> None:
        super().__init__(num_loops)
        self.kv_fill = check_kv_fill(kv_fill)
        self.prelude, self.core = config.prelude_layers, config.core_layers
        self.coda_slot = self.prelude + num_loops * self.core
        slots = self.coda_slot + config.coda_layers
        self.keys: list[torch.Tensor | None] = [None] * slots
        self.values: list[torch.Tensor | None] = [None] * slots
        self.reached: torch.Tensor | None = None
        self.exit_loops: torch.Tensor | None = None
        self.decoding = False  # this pass: one token per row, rows stop at their exit
        self._rows: torch.Tensor | None = None  # rows still computing (None: all)
        self._store, self._skipped = True, False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.reached is None else self.reached.shape[1]

    def add_columns(self, rows: int, length: int, device: torch.device) -> None:
        """After :meth:`begin_pass`: columns for the pass's ``length`` tokens per row; one
        token over a filled cache decodes (its keys and values go into a new column)."""
        self.decoding = length == 1 and self.reached is not None
        self._rows, self._store = None, True
        new = torch.full((rows, length), self.num_loops, dtype=torch.long, device=device)
        for name in ("reached", "exit_loops"):
            old = getattr(self, name)
            setattr(self, name, new.clone() if old is None else torch.cat([old, new], dim=1))
        if self.decoding:
            for buf in (self.keys, self.values):
                buf[:] = [torch.cat([t, t.new_zeros(*t.shape[:2], 1, t.shape[3])], dim=2)
                          for t in buf]

    def enter(self, t: int | None, rows: torch.Tensor | None = None, store: bool = True) -> None:
        """Before loop t's core blocks (0-based; None: the coda), for ``rows`` only
        (decoding); ``store=False``: the coda's keys and values are used, not kept."""
        self._call = self.coda_slot if t is None else self.prelude + t * self.core
        self._rows, self._store = rows, store

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        i, self._call = self._call, self._call + 1
        if self.decoding:  # the new column is the last one
            rows = slice(None) if self._rows is None else self._rows
            self.keys[i][rows, :, -1:] = k
            self.values[i][rows, :, -1:] = v
            return self.keys[i][rows], self.values[i][rows]
        if self.keys[i] is not None:
            k, v = torch.cat([self.keys[i], k], dim=2), torch.cat([self.values[i], v], dim=2)
        if self._store:
            self.keys[i], self.values[i] = k, v
        return k, v

    def loop_mask(self, mask: torch.Tensor, t: int, rows: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """``mask`` [B, 1, L, T] of loop t's core blocks (``skip``: columns that stopped
        before loop t + 1 hidden), cut to ``rows``."""
        if self._skipped:
            mask = mask & (self.reached > t)[:, None, None, :]
        return mask if rows is None else mask[rows]

    def exit_rows(self, rows: torch.Tensor, loops: int) -> None:
        """The new column of ``rows`` stopped after ``loops`` loops (decoding)."""
        self.reached[rows, -1] = loops
        if self.kv_fill == "skip":
            self._skipped = True
            return
        src = self.prelude + (loops - 1) * self.core
        for t in range(loops, self.num_loops):
            for j in range(self.core):
                for buf in (self.keys, self.values):
                    buf[self.prelude + t * self.core + j][rows, :, -1] = buf[src + j][rows, :, -1]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self.reached = self.reached.index_select(0, beam_idx.to(self.reached.device))
        self.exit_loops = self.exit_loops.index_select(0, beam_idx.to(self.reached.device))


class _GateExit:
    """Cumulative exit probability of the rows still looping, loop after loop: a row exits
    after loop t when 1 − ∏_{s≤t} (1 − λ_s) > T (loopline's ``gate`` criterion)."""

    def __init__(self, exit_gate: nn.Linear, threshold: float) -> None:
        self.exit_gate, self.threshold = exit_gate, threshold
        self.log_survive: torch.Tensor | None = None  # Σ_{s≤t} log(1 − λ_s) per row, fp32

    def exited(self, hidden: torch.Tensor) -> torch.Tensor:
        """Readout hidden [..., D] after one more loop → bool [...]: exits here."""
        z = self.exit_gate(hidden.reshape(-1, hidden.shape[-1])).squeeze(-1).float()
        log_stay = F.logsigmoid(-z)  # log(1 − λ_t)
        self.log_survive = log_stay if self.log_survive is None else self.log_survive + log_stay
        # cumulative exit probability 1 − exp(Σ log(1 − λ)) > T, i.e. expm1(Σ) < −T
        return (torch.expm1(self.log_survive) < -self.threshold).view(hidden.shape[:-1])

    def keep(self, still: torch.Tensor) -> None:
        self.log_survive = self.log_survive[still]


def full_depth_readout(model: nn.Module, state: torch.Tensor, e: torch.Tensor, loops: int,
                       threshold: float, rope, mask, cache: AdaptiveKVCache | None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(readout hidden [B, L, D], exit loop [B, L]): every position runs all ``loops`` loops,
    read out at its exit loop (module doc)."""
    B, L, _ = state.shape
    out = torch.empty_like(state)
    exit_loops = torch.full((B, L), loops, dtype=torch.long, device=state.device)
    done = torch.zeros(B, L, dtype=torch.bool, device=state.device)
    gate = _GateExit(model.exit_gate, threshold)
    for t in range(1, loops + 1):
        if cache is not None:
            cache.enter(t - 1)
        state = model._loop(state, e, t - 1, rope,
                            mask if cache is None else cache.loop_mask(mask, t - 1), cache)
        if cache is not None:
            cache.enter(None, store=t == loops)  # later tokens read the last loop's coda
        hidden = model._readout(state, rope, mask, cache)
        if t == loops:
            out[~done] = hidden[~done]
            break
        new = gate.exited(hidden) & ~done
        out[new] = hidden[new]
        exit_loops[new] = t
        done |= new
    if cache is not None:
        cache.exit_loops[:, -L:] = exit_loops
    return out, exit_loops


def adaptive_step(model: nn.Module, state: torch.Tensor, e: torch.Tensor, loops: int,
                  threshold: float, rope, mask, cache: AdaptiveKVCache
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(readout hidden [B, 1, D], exit loop [B, 1]) of one new token per row: each row
    stops at its exit loop, the rows still looping run the next (module doc)."""
    B = state.shape[0]
    rows = torch.arange(B, device=state.device)
    exit_loops = torch.full((B,), loops, dtype=torch.long, device=state.device)
    out = torch.empty_like(state)
    gate, part, (cos, sin) = _GateExit(model.exit_gate, threshold), None, rope
    sub_rope, sub_mask, sub_e = rope, mask, e
    for t in range(1, loops + 1):
        cache.enter(t - 1, part)
        state = model._loop(state, sub_e, t - 1, sub_rope, cache.loop_mask(mask, t - 1, part),
                            cache)
        cache.enter(None, part)
        hidden = model._readout(state, sub_rope, sub_mask, cache)
        stop = torch.ones(len(rows), dtype=torch.bool, device=state.device) if t == loops \
            else gate.exited(hidden)[:, 0]
        out[rows[stop]], exit_loops[rows[stop]] = hidden[stop], t
        if t == loops or bool(stop.all()):
            if t < loops:
                cache.exit_rows(rows, t)
            break
        if bool(stop.any()):
            cache.exit_rows(rows[stop], t)
            still = ~stop
            rows, state, part = rows[still], state[still], rows[still]
            gate.keep(still)
            sub_rope, sub_mask, sub_e = (cos[part], sin[part]), mask[part], e[part]
    cache.exit_loops[:, -1] = exit_loops
    return out, exit_loops[:, None]
