"""Per-token adaptive depth: each token stops looping once its prediction has settled.

A token exits at the first loop t < H whose readout meets the criterion, else at H:

- ``kl`` (Huginn's criterion, Geiping et al. 2025, arXiv:2502.05171): KL(p_t ‖ p_{t−1}) of
  the next-token distributions of two successive readouts falls below the threshold. p_0 is
  the readout of the initial loop state (uniform for ``state_init: zeros``), so a token can
  exit after loop 1.
- ``entropy``: the entropy of p_t (nats) falls below the threshold.

Semantics of this one-pass evaluation: every position's state keeps being computed up to H
(later tokens attend to it), and each token's prediction is read out at its own exit loop;
the "loops used" of a token is its exit loop. So the numbers say how much depth each token
needs, not how much compute a cached decoder would save. Scores are clamped at 0, so the
threshold 0 never exits early and reproduces the fixed H-loop result exactly: the adaptive
loss is the fixed loss at H (per-token losses computed as the H_eff sweep computes them)
plus the change of every token that exits early. Every loss carries a per-document
bootstrap standard error and a paired interval against the fixed loss at H.

One pass over loops 1..H per batch serves every threshold; readouts only cover the tokens
that have not yet exited under the smallest positive threshold (once a token exits there,
it has exited under every larger one).
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

from ..errors import ConfigError
from .heff_stats import DocumentAccumulator, DocumentLosses
from .stats import bootstrap_stderr, document_bootstrap, paired_column_diffs

log = logging.getLogger(__name__)
IGNORE_INDEX = -100
CRITERIA = ("kl", "entropy")
_CHUNK_ELEMENTS = 1 << 22  # logits elements per readout chunk (16 MiB in fp32)


@dataclass(frozen=True)
class AdaptiveSpec:
    """What the adaptive sweep evaluates: every threshold, one criterion, at most H loops."""

    thresholds: tuple[float, ...]
    criterion: str = "kl"
    max_loops: int = 0  # 0 = the largest H_eff of the fixed sweep

    @classmethod
    def from_eval_config(cls, eval_cfg: Any) -> AdaptiveSpec | None:
        """From ``eval.adaptive_*``; None when ``eval.adaptive_thresholds`` is empty (off)."""
        if not eval_cfg.adaptive_thresholds:
            return None
        return cls(tuple(float(x) for x in eval_cfg.adaptive_thresholds),
                   eval_cfg.adaptive_criterion, int(eval_cfg.adaptive_max_loops))

    def resolved(self, h_effs: Sequence[int]) -> AdaptiveSpec:
        """Thresholds sorted and distinct, ``max_loops`` 0 replaced by ``max(h_effs)``."""
        if self.criterion not in CRITERIA:
            raise ConfigError(f"eval.adaptive_criterion = {self.criterion!r} is not one of "
                              f"{list(CRITERIA)}; pick one")
        bad = [x for x in self.thresholds if not x >= 0]  # also catches nan
        if bad or not self.thresholds:
            raise ConfigError(f"eval.adaptive_thresholds {list(self.thresholds)} need values "
                              ">= 0 (0 = never exit early), e.g. [0, 0.001, 0.01]")
        if self.max_loops < 0:
            raise ConfigError(f"eval.adaptive_max_loops = {self.max_loops} must be >= 1, or 0 "
                              "for the largest eval.h_eff")
        max_loops = self.max_loops or max(h_effs)
        return AdaptiveSpec(tuple(sorted(set(self.thresholds))), self.criterion, max_loops)


def parse_adaptive(text: str, key: str = "h_eff") -> tuple[float, int | None]:
    """``"adaptive:THRESHOLD[:MAX]"`` → (threshold ≥ 0, max loops ≥ 1 or None)."""
    parts = str(text).split(":")
    fix = f"use {key}=adaptive:THRESHOLD or {key}=adaptive:THRESHOLD:MAX, e.g. adaptive:0.01:8"
    if parts[0].strip().lower() != "adaptive" or len(parts) not in (2, 3):
        raise ConfigError(f"{key}={text!r} is not an adaptive exit; {fix}")
    try:
        threshold = float(parts[1])
        max_loops = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ConfigError(f"{key}={text!r}: THRESHOLD must be a number and MAX an integer; "
                          f"{fix}") from None
    if not threshold >= 0 or math.isinf(threshold):
        raise ConfigError(f"{key}={text!r}: the threshold must be a finite number >= 0; {fix}")
    if max_loops is not None and max_loops < 1:
        raise ConfigError(f"{key}={text!r}: MAX must be at least 1 loop; {fix}")
    return threshold, max_loops


def exit_scores(logp: Tensor, prev_logp: Tensor | float | None, criterion: str) -> Tensor:
    """Per-row score [N] of log-probabilities [N, V]: KL(p ‖ prev) or the entropy of p, ≥ 0.

    ``prev_logp`` may be one number for every entry (−log V: the uniform distribution).
    """
    p = logp.exp()
    if criterion == "kl":
        assert prev_logp is not None, "the kl criterion needs the previous readout"
        score = torch.einsum("...v,...v->...", p, logp - prev_logp)  # 4× linalg.vecdot's speed
    else:
        score = -torch.einsum("...v,...v->...", p, logp)
    return score.clamp_min_(0.0)  # rounding can dip below 0; 0 must never exit early


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
        self.kl = criterion == "kl"
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

    def score(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """(score [a], cross-entropy [a]) of hidden rows [a, D]; the kl score needs
        :meth:`start` first (before it, the scores are left unset)."""
        a = hidden.shape[0]
        score = torch.empty(a, dtype=torch.float32, device=hidden.device)
        ce = torch.empty(a, dtype=torch.float32, device=hidden.device)
        table = self.logp[self.cur][:a] if self.kl else None
        for start in range(0, a, self.step):
            c = slice(start, min(start + self.step, a))
            m = c.stop - c.start
            z = torch.mm(hidden[c].float(), self.weight.T, out=self.z[:m])
            logp = table[c] if table is not None else self.logp[0][:m]
            torch.log_softmax(z, dim=-1, out=logp)
            p = torch.exp(logp, out=self.p[:m])
            if not self.kl:
                score[c] = torch.einsum("nv,nv->n", p, logp).neg_()
            elif self.prev is not None:
                prev = self.prev[c] if isinstance(self.prev, Tensor) else self.prev
                score[c] = torch.einsum("nv,nv->n", p, torch.sub(logp, prev, out=z))
            ce[c] = logp.gather(1, targets[c, None]).squeeze(1).neg_()
        if table is not None:
            self.prev, self.cur = table, 1 - self.cur
        return score.clamp_min_(0.0), ce  # rounding can dip below 0; 0 never exits early


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
    positive = [x for x in spec.thresholds if x > 0]
    # Score and cross-entropy of every token after loops 1..H-1 (inf: no longer read out).
    scores = torch.full((max(H - 1, 0), n), math.inf, dtype=torch.float32, device=dev)
    ces = torch.zeros(max(H - 1, 0), n, dtype=torch.float32, device=dev)
    # Tokens still read out: not yet exited under the smallest positive threshold (then
    # they have exited under every larger one too).
    active = torch.arange(n if positive and H > 1 else 0, device=dev)
    lowest = min(positive, default=0.0)
    state = model.init_state(ctx)
    scorer = _Scorer(model, active.numel(), criterion)
    if criterion == "kl" and active.numel():  # readout 0: the initial state
        scorer.start(_hidden_rows(model, state, ctx, rows), targets[rows])
    for t in range(1, H + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        if t == H or not active.numel():
            continue
        whole = active.numel() == n
        pos = rows if whole else rows[active]
        score, ce = scorer.score(_hidden_rows(model, state, ctx, pos, True), targets[pos])
        if whole:
            scores[t - 1], ces[t - 1] = score, ce
        else:
            scores[t - 1, active], ces[t - 1, active] = score, ce
        still = score >= lowest
        if not bool(still.all()):
            active = active[still]
            scorer.keep(still)
    ce_h = cross_entropy_rows(model, _hidden_rows(model, state, ctx, rows), targets[rows])
    thr = torch.tensor(spec.thresholds, dtype=torch.float32, device=dev)[:, None, None]
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


# ------------------------------------------------------------------ generation and scoring


@torch.no_grad()
def adaptive_logits(model: torch.nn.Module, batch_or_input_ids: Any, threshold: float,
                    max_loops: int, criterion: str = "kl") -> tuple[Tensor, Tensor]:
    """(logits [B, L, V], exit loop [B, L]): every position read out at its own exit loop.

    For lm-eval scoring and generation; the same criterion as :func:`adaptive_sweep`.
    """
    if criterion not in CRITERIA:
        raise ConfigError(f"adaptive criterion {criterion!r} is not one of {list(CRITERIA)}")
    if max_loops < 1:
        raise ConfigError(f"adaptive max loops = {max_loops} must be at least 1")
    ctx = model.embed(batch_or_input_ids)
    state = model.init_state(ctx)
    prev = None
    if criterion == "kl" and max_loops > 1:
        prev = torch.log_softmax(model.readout_logits(state, ctx).float(), dim=-1)
    out: Tensor | None = None
    exit_loop: Tensor | None = None
    for t in range(1, max_loops + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        logits = model.readout_logits(state, ctx)  # [B, L, V]
        if out is None:
            out = torch.empty_like(logits)
            exit_loop = torch.full(logits.shape[:2], max_loops, dtype=torch.int64,
                                   device=logits.device)
            done = torch.zeros(logits.shape[:2], dtype=torch.bool, device=logits.device)
        if t == max_loops:
            out[~done] = logits[~done]
            break
        logp = torch.log_softmax(logits.float(), dim=-1)
        new = (exit_scores(logp, prev, criterion) < threshold) & ~done
        out[new] = logits[new]
        exit_loop[new] = t
        done |= new
        prev = logp
    assert out is not None and exit_loop is not None
    return out, exit_loop
