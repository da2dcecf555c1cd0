"""Readouts of scored rows for the H_eff sweep and adaptive exit: cross-entropy, entropy, KL.

The sweep reads out every scored token at its fixed loop counts (:func:`cross_entropy_rows`)
and, for adaptive exit, the tokens still looping after every loop (:class:`RowReadout`): one
readout of a set of rows serves every criterion whose still-active rows are that set (its
cross-entropy, the entropy and KL scores, the top token).

A row's values are computed in row chunks of the readout, and a BLAS matrix product may
round a row differently with a different number of rows beside it (small products take
other kernels). So rows are never read out in a larger set than a criterion alone would
read: sharing is exact, bit for bit, with one pass per criterion.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

_CHUNK_ELEMENTS = 1 << 22  # logits elements per readout chunk (16 MiB in fp32)


def chunks(n: int, vocab: int) -> Iterable[slice]:
    """Row slices of ``n`` rows, each with at most ``_CHUNK_ELEMENTS`` logits."""
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def cross_entropy_rows(model: torch.nn.Module, hidden: Tensor, targets: Tensor,
                       hits: Tensor | None = None) -> Tensor:
    """Per-row cross-entropy [a] of readout hidden rows [a, D] (logsumexp − target logit,
    in row chunks: [a, V] logits never exist at once); the fixed H_eff losses, and the
    fixed column of adaptive exit. ``hits`` [a] bool, when given, receives whether each
    row's top logit is its target (label accuracy)."""
    weight = model.head_weight
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for c in chunks(hidden.shape[0], weight.shape[0]):
        logits = F.linear(hidden[c], weight).float()
        out[c] = torch.logsumexp(logits, dim=1) - logits.gather(1, targets[c, None]).squeeze(1)
        if hits is not None:
            hits[c] = logits.argmax(dim=1) == targets[c]
    return out


class LoopHidden:
    """Readout hidden rows of one loop state; the whole readout is computed at most once."""

    def __init__(self, model: Any, state: Tensor, ctx: Any) -> None:
        self.model, self.state, self.ctx = model, state, ctx
        self._all: Tensor | None = None

    def all_rows(self, rows: Tensor) -> Tensor:
        """Hidden rows [len(rows), D] of the flattened positions ``rows``, read out from
        every position (coda blocks attend across positions)."""
        if self._all is None:
            hidden = self.model.readout_hidden(self.state, self.ctx)
            self._all = hidden.reshape(-1, hidden.shape[-1])
        return self._all[rows]

    def rows(self, rows: Tensor) -> Tensor:
        """Like :meth:`all_rows`, but without coda blocks the readout is the final norm,
        row by row, so it runs on the gathered rows only (the tokens still looping)."""
        if self.model.cfg.coda_layers == 0:
            return self.model.readout_hidden(self.state.reshape(-1, self.state.shape[-1])[rows],
                                             self.ctx)
        return self.all_rows(rows)

    def state_rows(self, rows: Tensor) -> Tensor:
        """Loop state rows [len(rows), D]."""
        return self.state.reshape(-1, self.state.shape[-1])[rows]


class KlMemory:
    """The kl criterion's previous readout: log-probs [a, V] of its still-active rows (two
    [n, V] tables, swapped every loop), or −log V for a uniform readout 0."""

    def __init__(self, n: int, vocab: int, device: torch.device) -> None:
        self.tables = [torch.empty(max(n, 1), vocab, dtype=torch.float32, device=device)
                       for _ in range(2)]
        self.cur = 0
        self.prev: Tensor | float | None = None

    def table(self, a: int) -> Tensor:
        """Where this loop's log-probs [a, V] go."""
        return self.tables[self.cur][:a]

    def advance(self, table: Tensor) -> None:
        self.prev, self.cur = table, 1 - self.cur

    def keep(self, still: Tensor) -> None:
        """Drop the rows that stopped being read out."""
        if isinstance(self.prev, Tensor):
            self.prev = self.prev[still]


@dataclass
class Readout:
    """What one readout of rows [a] gives the criteria reading those rows."""

    ce: Tensor  # [a] cross-entropy of the targets
    entropy: Tensor | None  # [a] entropy of p_t, ≥ 0 (when asked)
    kl: Tensor | None  # [a] KL(p_t ‖ p_{t−1}), ≥ 0 (when a KlMemory with a previous readout)
    top: Tensor | None  # [a] int64 top token (when asked)


class RowReadout:
    """Readouts of hidden rows, loop after loop, in buffers allocated once per batch.

    Fresh [rows, V] tensors every loop cost more here (page faults of large allocations)
    than the arithmetic on them, so the logits, probabilities and log-probabilities live in
    reused buffers; row chunks bound them.
    """

    def __init__(self, model: torch.nn.Module, n: int) -> None:
        self.weight = model.head_weight.detach().float()  # [V, D]
        vocab, dev = self.weight.shape[0], self.weight.device
        self.step = max(1, _CHUNK_ELEMENTS // vocab)
        rows = max(1, min(n, self.step))
        self.z, self.p, self.logp = (torch.empty(rows, vocab, dtype=torch.float32, device=dev)
                                     for _ in range(3))

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    def kl_start(self, hidden: Tensor, targets: Tensor, memory: KlMemory) -> None:
        """Readout 0 of the kl criterion: −log V when its hidden rows are all zero
        (``state_init: zeros`` without coda blocks gives zero logits, a uniform
        distribution), else the log-probs of ``hidden``."""
        if not bool(hidden.any()):
            memory.prev = -math.log(self.vocab)
        else:
            self.read(hidden, targets, kl=memory)

    def read(self, hidden: Tensor, targets: Tensor, *, entropy: bool = False,
             top: bool = False, kl: KlMemory | None = None) -> Readout:
        """Readout of hidden rows [a, D]; with ``kl``, its log-probs are written to the
        memory's table (the next loop's previous readout) and, when it holds one, the KL
        against the previous readout is returned."""
        a, dev = hidden.shape[0], hidden.device
        out = Readout(torch.empty(a, dtype=torch.float32, device=dev),
                      torch.zeros(a, dtype=torch.float32, device=dev) if entropy else None,
                      torch.zeros(a, dtype=torch.float32, device=dev)
                      if kl is not None and kl.prev is not None else None,
                      torch.empty(a, dtype=torch.int64, device=dev) if top else None)
        table = kl.table(a) if kl is not None else None
        for start in range(0, a, self.step):
            c = slice(start, min(start + self.step, a))
            m = c.stop - c.start
            z = torch.mm(hidden[c].float(), self.weight.T, out=self.z[:m])
            logp = table[c] if table is not None else self.logp[:m]
            torch.log_softmax(z, dim=-1, out=logp)
            p = torch.exp(logp, out=self.p[:m])
            if out.entropy is not None:
                out.entropy[c] = torch.einsum("nv,nv->n", p, logp).neg_()
            if out.kl is not None:
                prev = kl.prev[c] if isinstance(kl.prev, Tensor) else kl.prev
                out.kl[c] = torch.einsum("nv,nv->n", p, torch.sub(logp, prev, out=z))
            out.ce[c] = logp.gather(1, targets[c, None]).squeeze(1).neg_()
            if out.top is not None:
                out.top[c] = logp.argmax(dim=1)
        if kl is not None:
            kl.advance(table)
        for score in (out.entropy, out.kl):
            if score is not None:
                score.clamp_min_(0.0)  # rounding can dip below 0; 0 never exits early
        return out
