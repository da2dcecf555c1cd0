"""ONE pass per batch for a snapshot's whole H_eff sweep: the fixed H_eff losses and the
adaptive exits of every criterion.

Loop t never depends on the total loop count, so each batch runs its loops once, up to the
largest of the H_eff list and every criterion's max loops. The fixed losses are read out
at their counts; every criterion scores loops 1..H−1 of the tokens it still reads out
(:class:`~.exit.runs.CriterionExits`), each with its own set of still-active rows. Criteria
whose active rows are the same set share one readout (logits, log-softmax, cross-entropy,
entropy, KL, top token), and a criterion's cross-entropies after its max loops are the
fixed readout at that count. The numbers equal, bit for bit, one pass for the fixed sweep
and one per criterion (:mod:`.exit.readout` says why sharing stops at identical sets).

Those exits are what each token needs; with ``spent``, each batch is also decoded by the
cached decoder under each ``kv_fill`` (:mod:`.exit.replay`): what it would spend.

On a labelled pack (``labels``: targets are labels of the input tokens) the same readouts
also say whether each scored token's top token is its label, at every H_eff and at each
token's exit under every threshold (:mod:`.label_accuracy` turns the counts into accuracy).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ..errors import ConfigError
from ..spec.names import IGNORE_INDEX
from ..spec.rules import KV_FILLS
from .exit.readout import LoopHidden, RowReadout, cross_entropy_rows
from .exit.replay import replay_batch
from .exit.results import AdaptiveLosses, document_keys
from .exit.runs import CriterionExits
from .exit.spec import ExitSpec
from .heff_stats import DocumentAccumulator, DocumentLosses


class NoTokensScored(ConfigError):
    """The sweep's batches held no scored target (an empty split, or no answer tokens)."""


@dataclass
class BatchLosses:
    """Per scored token of one batch (row-major order of the targets not ignored)."""

    fixed: Tensor | None  # [n, len(h_effs)] fp32 cross-entropy at each H_eff (None: no H_eff)
    exits: list[tuple[Tensor, Tensor]]  # per spec: losses [n, K+1], exit loops [n, K]
    # (see CriterionExits.result)
    hits: Tensor | None = None  # labels: [n, len(h_effs)] bool, top token = target at each H_eff
    exit_hits: list[Tensor] = field(default_factory=list)  # labels, per spec: [n, K] bool at
    # the token's exit under threshold k (CriterionExits.hits_at_exit)


@dataclass
class SweepDocuments:
    """Per-document sums of one pass: the fixed H_eff losses and each spec's exits."""

    fixed: DocumentLosses
    adaptive: list[AdaptiveLosses]
    labels: DocumentLosses | None = None  # labels: Σ label hits per document and H_eff


@torch.no_grad()
def sweep_batch(model: torch.nn.Module, batch: Any, h_effs: Sequence[int],
                specs: Sequence[ExitSpec], labels: bool = False) -> BatchLosses:
    """The fixed losses at every H_eff and the exits of every (resolved) spec, from one run
    of the loops over ``batch``; with ``labels``, also the label hits at both."""
    hs = sorted({int(h) for h in h_effs})
    ctx = model.embed(batch)
    targets = ctx.targets.reshape(-1)
    rows = (targets != IGNORE_INDEX).nonzero().squeeze(1)  # scored positions [n]
    scored = targets[rows]
    readout = RowReadout(model, rows.numel())
    runs = [CriterionExits(model, spec, rows.numel(), readout, labels) for spec in specs]
    state = model.init_state(ctx)
    loop = LoopHidden(model, state, ctx)
    for run in runs:
        run.start(loop, rows, scored, readout)
    stops = {*hs, *(spec.max_loops for spec in specs)}
    fixed: dict[int, Tensor] = {}  # loop count → cross-entropy of every scored token
    hits: dict[int, Tensor] = {}  # labels: loop count → top token = target, per scored token
    for t in range(1, max(stops, default=0) + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        loop = LoopHidden(model, state, ctx)
        if t in stops:
            if labels:
                hits[t] = torch.empty(rows.numel(), dtype=torch.bool, device=rows.device)
            fixed[t] = cross_entropy_rows(model, loop.all_rows(rows), scored, hits.get(t))
        _read_exits(loop, rows, scored, [run for run in runs if run.reads(t)], readout, t)
    out = BatchLosses(torch.stack([fixed[h] for h in hs], dim=1) if hs else None,
                      [run.result(fixed[run.spec.max_loops]) for run in runs])
    if labels:
        out.hits = torch.stack([hits[h] for h in hs], dim=1) if hs else None
        out.exit_hits = [run.hits_at_exit(hits[run.spec.max_loops]) for run in runs]
    return out


def _read_exits(loop: LoopHidden, rows: Tensor, scored: Tensor,
                runs: Sequence[CriterionExits], readout: RowReadout, t: int) -> None:
    """Loop t's readout for the criteria still reading, once per distinct set of rows."""
    for group in _by_active_rows(runs):
        active = group[0].active
        whole = active.numel() == rows.numel()
        pos = rows if whole else rows[active]
        hidden = loop.rows(pos)
        out = readout.read(hidden, scored if whole else scored[active],
                           entropy=any(run.wants_entropy for run in group),
                           top=any(run.wants_top for run in group),
                           kl=next((run.kl for run in group if run.kl is not None), None))
        states = (loop.state_rows(pos) if any(run.tracker is not None for run in group)
                  else None)
        for run in group:
            run.record(t, out, states, hidden)


def _by_active_rows(runs: Sequence[CriterionExits]) -> list[list[CriterionExits]]:
    """The runs grouped by identical active rows (a group holds at most one kl run: a
    readout feeds one KL memory)."""
    groups: list[list[CriterionExits]] = []
    for run in runs:
        for group in groups:
            if torch.equal(group[0].active, run.active) and not (
                    run.kl is not None and any(other.kl is not None for other in group)):
                group.append(run)
                break
        else:
            groups.append([run])
    return groups


class _ExitSums:
    """Per-document losses [n, K+1] and Σ loops [K] of one spec's exits, batch by batch;
    with ``labels``, per document Σ label hits at the exit [K] and Σ exit loops [K]."""

    def __init__(self, spec: ExitSpec, labels: bool = False) -> None:
        self.spec = spec
        K = len(spec.thresholds)
        self.documents = DocumentAccumulator(range(K + 1))
        self.labels = DocumentAccumulator(range(2 * K)) if labels else None
        self.loops = np.zeros(K, dtype=np.int64)
        self.kv_bytes_per_token: int | None = None

    def add(self, keys: np.ndarray, losses: Tensor, exit_loops: Tensor,
            hits: Tensor | None = None) -> None:
        self.documents.add(keys, losses.cpu().double().numpy())
        self.loops += exit_loops.sum(dim=0).cpu().numpy()
        if self.labels is not None:
            assert hits is not None, "a labelled sweep gives the hits at every exit"
            self.labels.add(keys, torch.cat([hits, exit_loops], dim=1).cpu().double().numpy())

    def finish(self, key_levels: np.ndarray | None = None) -> AdaptiveLosses:
        return AdaptiveLosses(self.spec, self.documents.finish(), [int(x) for x in self.loops],
                              kv_bytes_per_token=self.kv_bytes_per_token,
                              labels=None if self.labels is None
                              else self.labels.finish(key_levels))


def _replay(model: torch.nn.Module, batch: Any, keys: np.ndarray, spec: ExitSpec,
            needs: tuple[Tensor, Tensor], sums: dict[str, _ExitSums]) -> None:
    """The batch decoded by the cached decoder under every ``kv_fill``, added to ``sums``;
    ``needs``: the spec's exits in the sweep's pass (losses, exit loops)."""
    for fill, acc in sums.items():
        out = replay_batch(model, batch, spec, fill, needs)
        acc.add(keys, out.losses, out.loops)
        acc.kv_bytes_per_token = out.kv_bytes_per_token or acc.kv_bytes_per_token


@torch.no_grad()
def sweep_pass(model: torch.nn.Module, batches: Iterable[Any], h_effs: Sequence[int],
               specs: Sequence[ExitSpec], max_tokens: int,
               doc_levels: np.ndarray | None = None, spent: bool = False,
               labels: bool = False) -> SweepDocuments:
    """Summed token losses per document at every H_eff and under every threshold of every
    (resolved) spec, up to ``max_tokens`` targets; one run of the loops per batch.

    ``doc_levels`` (level per global document, -1 = unknown) labels the fixed sweep's
    documents when batches carry ``doc_index``. ``spent``: also every spec's replay by the
    cached decoder under each ``kv_fill`` (:attr:`AdaptiveLosses.spent`). ``labels`` (the
    batches' targets are labels): also the label hits per document at every H_eff
    (:attr:`SweepDocuments.labels`) and at every exit (:attr:`AdaptiveLosses.labels`).
    """
    model.eval()
    hs = sorted({int(h) for h in h_effs})
    fixed = DocumentAccumulator(hs)
    hits = DocumentAccumulator(hs) if labels else None
    exits = [_ExitSums(spec, labels) for spec in specs]
    replays = [{fill: _ExitSums(spec) for fill in (KV_FILLS if spent else ())} for spec in specs]
    tokens = rows = 0
    global_keys = True
    bar = tqdm(total=max_tokens, desc="H_eff sweep" + (" + adaptive exit" if specs else ""),
               unit="tok", leave=False)
    for batch in batches:
        n = int((batch["targets"] != IGNORE_INDEX).sum())
        if n:
            global_keys &= "doc_index" in batch
            keys = document_keys(batch, rows)
            out = sweep_batch(model, batch, hs, specs, labels)
            if out.fixed is not None:
                fixed.add(keys, out.fixed.cpu().double().numpy())
            if hits is not None and out.hits is not None:
                hits.add(keys, out.hits.cpu().double().numpy())
            exit_hits = out.exit_hits or [None] * len(exits)
            for acc, sums, (losses, exit_loops), hit in zip(exits, replays, out.exits, exit_hits,
                                                             strict=True):
                acc.add(keys, losses, exit_loops, hit)
                _replay(model, batch, keys, acc.spec, (losses, exit_loops), sums)
            tokens += n
            bar.update(n)
        rows += batch["targets"].shape[0]
        if tokens >= max_tokens:
            break
    bar.close()
    if tokens == 0:
        raise NoTokensScored("the H_eff sweep scored no tokens: the validation split is empty "
                             "or fully padded; raise data.val_fraction and re-pack")
    levels = doc_levels if global_keys else None
    adaptive = [acc.finish(levels) for acc in exits]
    for result, sums in zip(adaptive, replays, strict=True):
        for fill, acc in sums.items():
            result.spent[fill] = acc.finish()
            result.kv_bytes_per_token = result.spent[fill].kv_bytes_per_token
    return SweepDocuments(fixed.finish(levels), adaptive,
                          None if hits is None or not hs else hits.finish(levels))
