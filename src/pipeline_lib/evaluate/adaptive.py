"""Per-token adaptive depth: each token stops looping once its prediction has settled.

A token exits at the first loop t < H whose readout meets the criterion, else at H. The
criteria (:mod:`.exit_criteria`): ``kl`` (Huginn's, Geiping et al. 2025,
arXiv:2502.05171: KL(p_t ‖ p_{t−1}) of two successive readouts; p_0 is the readout of the
initial state, so a token can exit after loop 1), ``entropy`` of p_t, ``latent_diff`` and
``cosine`` of successive loop states, ``argmax_stable`` (top token unchanged for n loops)
and ``gate`` (the learned exit gate's cumulative exit probability). Each criterion of
``eval.adaptive_criteria`` is its own pass and its own section.

Semantics of this one-pass evaluation: every position's state keeps being computed up to H
(later tokens attend to it), and each token's prediction is read out at its own exit loop;
the "loops used" of a token is its exit loop. So the numbers say how much depth each token
needs, not how much compute a cached decoder would save. The threshold that never exits
(0; 1 for gate) reproduces the fixed H-loop result exactly: the adaptive
loss is the fixed loss at H (per-token losses computed as the H_eff sweep computes them)
plus the change of every token that exits early. Every loss carries a per-document
bootstrap standard error and a paired interval against the fixed loss at H.

One pass over loops 1..H per batch serves every threshold; readouts only cover the tokens
that have not yet exited under the strictest threshold that can exit (once a token exits
there, it has exited under every more lenient one).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from ..config_rules import adaptive_criteria, check_exit_threshold, criterion_thresholds
from ..errors import ConfigError
from .exit_criteria import (  # noqa: F401 (adaptive_logits, parse_adaptive: public here too)
    CRITERIA,
    LOGIT_CRITERIA,
    ExitTracker,
    adaptive_logits,
    exit_threshold,
    never_exits,
    parse_adaptive,
)
from .heff_stats import DocumentAccumulator, DocumentLosses
from .stats import bootstrap_stderr, document_bootstrap, paired_column_diffs

log = logging.getLogger(__name__)
IGNORE_INDEX = -100
_CHUNK_ELEMENTS = 1 << 22  # logits elements per readout chunk (16 MiB in fp32)


@dataclass(frozen=True)
class AdaptiveSpec:
    """What the adaptive sweep evaluates: every threshold, one criterion, at most H loops."""

    thresholds: tuple[float, ...]
    criterion: str = "kl"
    max_loops: int = 0  # 0 = the largest H_eff of the fixed sweep

    @classmethod
    def from_eval_config(cls, eval_cfg: Any) -> AdaptiveSpec | None:
        """The first of :meth:`all_from_eval_config`, or None (off)."""
        specs = cls.all_from_eval_config(eval_cfg)
        return specs[0] if specs else None

    @classmethod
    def all_from_eval_config(cls, eval_cfg: Any) -> list[AdaptiveSpec]:
        """One spec per criterion of ``eval.adaptive_criteria`` (or ``adaptive_criterion``)
        with its thresholds; none when ``eval.adaptive_thresholds`` is empty (off)."""
        if not eval_cfg.adaptive_thresholds:
            return []
        return [cls(tuple(float(x) for x in criterion_thresholds(eval_cfg, c)), c,
                    int(eval_cfg.adaptive_max_loops)) for c in adaptive_criteria(eval_cfg)]

    def resolved(self, h_effs: Sequence[int]) -> AdaptiveSpec:
        """Thresholds sorted and distinct, ``max_loops`` 0 replaced by ``max(h_effs)``."""
        if self.criterion not in CRITERIA:
            raise ConfigError(f"eval.adaptive_criterion = {self.criterion!r} is not one of "
                              f"{list(CRITERIA)}; pick one")
        key = f"eval.adaptive_thresholds ({self.criterion})"
        if not self.thresholds:
            raise ConfigError(f"{key} is empty; list thresholds, e.g. [0, 0.001, 0.01]")
        for x in self.thresholds:
            check_exit_threshold(self.criterion, x, key)
        if self.max_loops < 0:
            raise ConfigError(f"eval.adaptive_max_loops = {self.max_loops} must be >= 1, or 0 "
                              "for the largest eval.h_eff")
        max_loops = self.max_loops or max(h_effs)
        return AdaptiveSpec(tuple(sorted(set(self.thresholds))), self.criterion, max_loops)


def _chunks(n: int, vocab: int) -> Iterable[slice]:
    step = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def _hidden_rows(model: torch.nn.Module, state: Tensor, ctx: Any, rows: Tensor,
                 gather_first: bool = False) -> Tensor:
    """Readout hidden states [len(rows), D] of the flattened positions ``rows``.

    ``gather_first``: without coda blocks the readout is the final norm, row by row, so it
    can run on the gathered rows only (the tokens still looping), not on every position.
    """
    if gather_first and model.cfg.coda_layers == 0:
        return model.readout_hidden(state.reshape(-1, state.shape[-1])[rows], ctx)
    hidden = model.readout_hidden(state, ctx)
    return hidden.reshape(-1, hidden.shape[-1])[rows]


class _Scorer:
    """Exit scores and cross-entropies of hidden rows, loop after loop, in reused buffers.

    Fresh [rows, V] tensors every loop cost more here (page faults of large allocations)
    than the arithmetic on them, so the logits, probabilities and log-probabilities live in
    buffers allocated once per batch; row chunks bound them. The kl criterion keeps the
    previous loop's log-probs [a, V] (two buffers, swapped every loop).
    """

    def __init__(self, model: torch.nn.Module, n: int, criterion: str) -> None:
        self.weight = model.head_weight.detach().float()  # [V, D]
        vocab, dev = self.weight.shape[0], self.weight.device
        self.kl, self.entropy = criterion == "kl", criterion == "entropy"
        self.top = criterion == "argmax_stable"  # also the top token of every row
        self.step = max(1, _CHUNK_ELEMENTS // vocab)
        rows = max(1, min(n, self.step))
        self.z = torch.empty(rows, vocab, dtype=torch.float32, device=dev)
        self.p = torch.empty(rows, vocab, dtype=torch.float32, device=dev)
        self.logp = [torch.empty(max(n, 1) if self.kl else rows, vocab, dtype=torch.float32,
                                 device=dev) for _ in range(2 if self.kl else 1)]
        self.cur = 0
        self.prev: Tensor | float | None = None  # kl: previous log-probs [a, V], or −log V

    def start(self, hidden: Tensor, targets: Tensor) -> None:
        """Readout 0 (kl only): −log V when its hidden rows are all zero (``state_init:
        zeros`` without coda blocks gives zero logits, a uniform distribution)."""
        if not bool(hidden.any()):
            self.prev = -math.log(self.weight.shape[0])
        else:
            self.score(hidden, targets)

    def keep(self, still: Tensor) -> None:
        """Drop the rows that stopped being read out from the kept log-probs."""
        if isinstance(self.prev, Tensor):
            self.prev = self.prev[still]

    def score(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor | None]:
        """(score [a], cross-entropy [a], top token [a] or None) of hidden rows [a, D]; the
        kl score needs :meth:`start` first (before it, and for criteria not scored from the
        logits, the scores are 0)."""
        a = hidden.shape[0]
        score = torch.zeros(a, dtype=torch.float32, device=hidden.device)
        ce = torch.empty(a, dtype=torch.float32, device=hidden.device)
        top = torch.empty(a, dtype=torch.int64, device=hidden.device) if self.top else None
        table = self.logp[self.cur][:a] if self.kl else None
        for start in range(0, a, self.step):
            c = slice(start, min(start + self.step, a))
            m = c.stop - c.start
            z = torch.mm(hidden[c].float(), self.weight.T, out=self.z[:m])
            logp = table[c] if table is not None else self.logp[0][:m]
            torch.log_softmax(z, dim=-1, out=logp)
            p = torch.exp(logp, out=self.p[:m])
            if self.entropy:
                score[c] = torch.einsum("nv,nv->n", p, logp).neg_()
            elif self.kl and self.prev is not None:
                prev = self.prev[c] if isinstance(self.prev, Tensor) else self.prev
                score[c] = torch.einsum("nv,nv->n", p, torch.sub(logp, prev, out=z))
            ce[c] = logp.gather(1, targets[c, None]).squeeze(1).neg_()
            if top is not None:
                top[c] = logp.argmax(dim=1)
        if table is not None:
            self.prev, self.cur = table, 1 - self.cur
        return score.clamp_min_(0.0), ce, top  # rounding can dip below 0; 0 never exits early


def cross_entropy_rows(model: torch.nn.Module, hidden: Tensor, targets: Tensor) -> Tensor:
    """Per-row cross-entropy [a] of readout hidden rows [a, D] (logsumexp − target logit,
    in row chunks: [a, V] logits never exist at once). The H_eff sweep uses it too, so the
    adaptive sweep's fixed column matches the sweep bit for bit."""
    weight = model.head_weight
    out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
    for c in _chunks(hidden.shape[0], weight.shape[0]):
        logits = F.linear(hidden[c], weight).float()
        out[c] = torch.logsumexp(logits, dim=1) - logits.gather(1, targets[c, None]).squeeze(1)
    return out


@torch.no_grad()
def adaptive_batch(model: torch.nn.Module, batch: Any, spec: AdaptiveSpec
                   ) -> tuple[Tensor, Tensor]:
    """Per scored token (row-major order of the targets that are not ignored):

    - losses [n, K+1] fp32: column 0 the cross-entropy after H loops (the fixed result),
      column 1+k the cross-entropy read out at the token's exit under threshold k;
    - exit loops [n, K] int64 (H where the token never exits early).

    ``spec`` must be resolved (:meth:`AdaptiveSpec.resolved`).
    """
    H, criterion = spec.max_loops, spec.criterion
    ctx = model.embed(batch)
    targets = ctx.targets.reshape(-1)
    rows = (targets != IGNORE_INDEX).nonzero().squeeze(1)  # scored positions [n]
    n, dev = rows.numel(), targets.device
    # the compared values (exit: score < it); those of thresholds that can exit early
    internal = [exit_threshold(criterion, x) for x in spec.thresholds]
    can_exit = [v for v, x in zip(internal, spec.thresholds, strict=True)
                if not never_exits(criterion, x)]
    # Score and cross-entropy of every token after loops 1..H-1 (inf: no longer read out).
    scores = torch.full((max(H - 1, 0), n), math.inf, dtype=torch.float32, device=dev)
    ces = torch.zeros(max(H - 1, 0), n, dtype=torch.float32, device=dev)
    # Tokens still read out: not yet exited under the strictest threshold that can exit
    # (then they have exited under every more lenient one too).
    active = torch.arange(n if can_exit and H > 1 else 0, device=dev)
    lowest = min(can_exit, default=0.0)
    state = model.init_state(ctx)
    scorer = _Scorer(model, active.numel(), criterion)
    tracker = None if criterion in LOGIT_CRITERIA else ExitTracker(model, criterion)
    if criterion == "kl" and active.numel():  # readout 0: the initial state
        scorer.start(_hidden_rows(model, state, ctx, rows), targets[rows])
    if tracker is not None and active.numel():
        tracker.start(state.reshape(-1, state.shape[-1])[rows])
    for t in range(1, H + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        if t == H or not active.numel():
            continue
        whole = active.numel() == n
        pos = rows if whole else rows[active]
        hidden = _hidden_rows(model, state, ctx, pos, True)
        score, ce, top = scorer.score(hidden, targets[pos])
        if tracker is not None:
            score = tracker.score(state.reshape(-1, state.shape[-1])[pos], hidden, top)
        if whole:
            scores[t - 1], ces[t - 1] = score, ce
        else:
            scores[t - 1, active], ces[t - 1, active] = score, ce
        still = score >= lowest
        if not bool(still.all()):
            active = active[still]
            scorer.keep(still)
            if tracker is not None:
                tracker.keep(still)
    ce_h = cross_entropy_rows(model, _hidden_rows(model, state, ctx, rows), targets[rows])
    thr = torch.tensor(internal, dtype=torch.float32, device=dev)[:, None, None]
    hit = torch.cat([scores[None] < thr, torch.ones(len(spec.thresholds), 1, n,
                                                   dtype=torch.bool, device=dev)], dim=1)
    first = hit.to(torch.uint8).argmax(dim=1)  # [K, n]: exit loop − 1 (H − 1: never early)
    at_exit = torch.cat([ces, ce_h[None]]).gather(0, first)  # [K, n]
    return torch.cat([ce_h[None], at_exit]).T, (first + 1).T


def document_keys(batch: Any, n_rows_before: int) -> np.ndarray:
    """Document of every scored token, as the H_eff sweep keys it: the global ``doc_index``
    when the loader gives it, else (row, ``doc_ids``) as one integer (else the row)."""
    valid = batch["targets"] != IGNORE_INDEX
    if "doc_index" in batch:
        return batch["doc_index"][valid].cpu().numpy().astype(np.int64)
    B, L = valid.shape
    rows = torch.arange(B, device=valid.device)[:, None] + n_rows_before
    doc = batch.get("doc_ids")
    keys = rows * (L + 1) + (doc if doc is not None else 0)
    return keys.expand(B, L)[valid].cpu().numpy().astype(np.int64)


@dataclass
class AdaptiveLosses:
    """Per-document sums of one adaptive sweep: column 0 fixed at H, 1+k threshold k."""

    spec: AdaptiveSpec
    documents: DocumentLosses
    loops_used: list[int]  # Σ exit loops over scored tokens, per threshold

    @property
    def tokens(self) -> int:
        return self.documents.total_tokens


@torch.no_grad()
def adaptive_documents(model: torch.nn.Module, batches: Iterable[Any], spec: AdaptiveSpec,
                       max_tokens: int) -> AdaptiveLosses:
    """One pass per batch over the batches the H_eff sweep reads (same stop at
    ``max_tokens``); ``spec`` must be resolved."""
    model.eval()
    K = len(spec.thresholds)
    acc = DocumentAccumulator(list(range(K + 1)))
    loops = np.zeros(K, dtype=np.int64)
    tokens = rows = 0
    bar = tqdm(total=max_tokens, desc=f"adaptive exit ({spec.criterion})", unit="tok",
               leave=False)
    for batch in batches:
        n = int((batch["targets"] != IGNORE_INDEX).sum())
        if n:
            losses, exit_loops = adaptive_batch(model, batch, spec)
            acc.add(document_keys(batch, rows), losses.cpu().double().numpy())
            loops += exit_loops.sum(dim=0).cpu().numpy()
            tokens += n
            bar.update(n)
        rows += batch["targets"].shape[0]
        if tokens >= max_tokens:
            break
    bar.close()
    if tokens == 0:
        raise ConfigError("the adaptive sweep scored no tokens: the validation split is empty "
                          "or fully padded; raise data.val_fraction and re-pack")
    return AdaptiveLosses(spec, acc.finish(), [int(x) for x in loops])


def adaptive_section(result: AdaptiveLosses, reference: DocumentLosses | None = None
                     ) -> dict[str, Any]:
    """The ``adaptive`` section of a sweep JSON (README § Evaluation).

    Per threshold: loss, its per-document bootstrap ``stderr``, ``mean_loops`` used and the
    paired difference to the fixed loss at H (``vs_fixed``: diff and 95% interval). The loss
    is the fixed loss at H plus the summed change of the tokens that exit early, so a
    threshold under which no token exits early (always 0) reproduces the fixed loss exactly;
    ``reference`` (the H_eff sweep's documents, when it covers H) supplies that fixed loss.
    """
    spec, docs = result.spec, result.documents
    T = docs.total_tokens
    sums = docs.loss_sums.sum(axis=0)  # [K+1]
    fixed = sums[0] / T
    if reference is not None and spec.max_loops in reference.h_effs:
        if reference.total_tokens != T:
            raise ValueError(f"reference sweep scored {reference.total_tokens} tokens, the "
                             f"adaptive sweep {T}: they must read the same batches")
        fixed = reference.means()[spec.max_loops]
    reps = document_bootstrap(docs.loss_sums, docs.tokens)  # [iters, K+1]
    stderr = bootstrap_stderr(reps)
    diffs = paired_column_diffs(reps, sums / T, 0)
    points = []
    for k, x in enumerate(spec.thresholds):
        change = (sums[k + 1] - sums[0]) / T  # exactly 0 when no token exits early
        points.append({"threshold": x, "loss": float(fixed + change),
                       "stderr": float(stderr[k + 1]), "mean_loops": result.loops_used[k] / T,
                       "tokens": T, "vs_fixed": diffs[k + 1].to_json()})
    log.info("adaptive exit (%s, max %d loops): %s", spec.criterion, spec.max_loops,
             [(p["threshold"], round(p["loss"], 4), round(p["mean_loops"], 2)) for p in points])
    return {"criterion": spec.criterion, "max_loops": spec.max_loops, "fixed_loss": float(fixed),
            "fixed_stderr": float(stderr[0]), "tokens": T,
            "documents": int(len(docs.tokens)), "points": points}


def adaptive_sweep(model: torch.nn.Module, batches: Iterable[Any], spec: AdaptiveSpec,
                   max_tokens: int, reference: DocumentLosses | None = None) -> dict[str, Any]:
    """:func:`adaptive_documents` then :func:`adaptive_section`."""
    return adaptive_section(adaptive_documents(model, batches, spec, max_tokens), reference)
