"""One criterion's adaptive exits over the loops of one batch, every threshold at once.

A token exits at the first loop t < H whose score is below a threshold, else at H
(:mod:`.criteria`). Scores and cross-entropies are kept for every loop 1..H−1 and
every scored token that is still read out: those that have not yet exited under the
strictest threshold that can exit (once a token exits there, it has exited under every
more lenient one). Each criterion keeps its own set of still-active rows; the sweep reads
them out (:class:`~.readout.RowReadout`) and hands the readout to :meth:`record`. On a
labelled pack (``labels``) whether each readout's top token is the target is kept too, so
label accuracy at each token's exit comes from the same pass (:meth:`hits_at_exit`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .criteria import LOGIT_CRITERIA, ExitTracker, exit_threshold, never_exits
from .readout import KlMemory, LoopHidden, Readout, RowReadout
from .spec import ExitSpec


class CriterionExits:
    """Exit scores of one resolved :class:`~.spec.ExitSpec` for the ``n`` scored
    tokens of a batch: :meth:`start` before loop 1, :meth:`record` after each loop t where
    :meth:`reads` (t), :meth:`result` with the cross-entropies after ``max_loops``."""

    def __init__(self, model: Any, spec: ExitSpec, n: int, readout: RowReadout,
                 labels: bool = False) -> None:
        self.spec, self.n = spec, n
        self.criterion, H = spec.criterion, spec.max_loops
        assert H >= 1, "resolve the spec first (ExitSpec.resolved)"
        vocab, dev = readout.vocab, readout.weight.device
        # the compared values (exit: score < it); those of thresholds that can exit early
        self.internal = [exit_threshold(self.criterion, x) for x in spec.thresholds]
        can_exit = [v for v, x in zip(self.internal, spec.thresholds, strict=True)
                    if not never_exits(self.criterion, x)]
        self.lowest = min(can_exit, default=0.0)
        # score and cross-entropy of every token after loops 1..H-1 (inf: not read out)
        self.scores = torch.full((max(H - 1, 0), n), math.inf, dtype=torch.float32, device=dev)
        self.ces = torch.zeros(max(H - 1, 0), n, dtype=torch.float32, device=dev)
        # labels: whether the top token after loops 1..H-1 is the target (False: not read out)
        self.hits = (torch.zeros(max(H - 1, 0), n, dtype=torch.bool, device=dev) if labels
                     else None)
        self.targets: Tensor | None = None
        self.active = torch.arange(n if can_exit and H > 1 else 0, device=dev)  # [a]
        self.kl = KlMemory(self.active.numel(), vocab, dev) if self.criterion == "kl" else None
        self.tracker = (None if self.criterion in LOGIT_CRITERIA
                        else ExitTracker(model, self.criterion))  # gate: needs the gate

    @property
    def wants_entropy(self) -> bool:
        return self.criterion == "entropy"

    @property
    def wants_top(self) -> bool:
        return self.criterion == "argmax_stable" or self.hits is not None

    def reads(self, t: int) -> bool:
        """Whether loop t's readout of the active rows is needed."""
        return t < self.spec.max_loops and self.active.numel() > 0

    def start(self, loop0: LoopHidden, rows: Tensor, targets: Tensor,
              readout: RowReadout) -> None:
        """Readout 0 of the initial state (kl) or its state rows (latent_diff, cosine);
        ``rows`` are the scored positions, ``targets`` their targets."""
        self.targets = targets
        if not self.active.numel():
            return
        if self.kl is not None:
            readout.kl_start(loop0.all_rows(rows), targets, self.kl)
        if self.tracker is not None:
            self.tracker.start(loop0.state_rows(rows))

    def record(self, t: int, out: Readout, state_rows: Tensor | None, hidden: Tensor) -> None:
        """Loop t's readout ``out`` of the active rows (their state rows and readout hidden
        rows [a, D] for the trackers); tokens that exited under the strictest threshold
        stop being read out."""
        if self.tracker is not None:
            score = self.tracker.score(state_rows, hidden, out.top)
        else:
            score = out.kl if self.kl is not None else out.entropy
        assert score is not None, "kl reads out its initial state first (start)"
        if self.active.numel() == self.n:
            self.scores[t - 1], self.ces[t - 1] = score, out.ce
        else:
            self.scores[t - 1, self.active], self.ces[t - 1, self.active] = score, out.ce
        if self.hits is not None:
            assert out.top is not None and self.targets is not None, "labels read the top token"
            self.hits[t - 1, self.active] = out.top == self.targets[self.active]
        still = score >= self.lowest
        if not bool(still.all()):
            self.active = self.active[still]
            if self.kl is not None:
                self.kl.keep(still)
            if self.tracker is not None:
                self.tracker.keep(still)

    def _exit_index(self) -> Tensor:
        """[K, n]: each token's exit loop − 1 under threshold k (H − 1: never early)."""
        K, n, dev = len(self.internal), self.n, self.scores.device
        thr = torch.tensor(self.internal, dtype=torch.float32, device=dev)[:, None, None]
        hit = torch.cat([self.scores[None] < thr,
                         torch.ones(K, 1, n, dtype=torch.bool, device=dev)], dim=1)
        return hit.to(torch.uint8).argmax(dim=1)

    def result(self, ce_h: Tensor) -> tuple[Tensor, Tensor]:
        """Per scored token, with ``ce_h`` [n] its cross-entropy after ``max_loops``:

        - losses [n, K+1] fp32: column 0 ``ce_h`` (the fixed result), column 1+k the
          cross-entropy read out at the token's exit under threshold k;
        - exit loops [n, K] int64 (``max_loops`` where the token never exits early).
        """
        first = self._exit_index()
        at_exit = torch.cat([self.ces, ce_h[None]]).gather(0, first)  # [K, n]
        return torch.cat([ce_h[None], at_exit]).T, (first + 1).T

    def hits_at_exit(self, hits_h: Tensor) -> Tensor:
        """[n, K] bool: whether each token's top token at its exit under threshold k is its
        target, with ``hits_h`` [n] that after ``max_loops`` (built with ``labels``)."""
        assert self.hits is not None, "built without labels"
        return torch.cat([self.hits, hits_h[None]]).gather(0, self._exit_index()).T
