"""Per-token adaptive depth: each token stops looping once its prediction has settled.

A token exits at the first loop t < H whose readout meets the criterion, else at H. The
criteria (:mod:`.exit_criteria`): ``kl`` (Huginn's, Geiping et al. 2025,
arXiv:2502.05171: KL(p_t ‖ p_{t−1}) of two successive readouts; p_0 is the readout of the
initial state, so a token can exit after loop 1), ``entropy`` of p_t, ``latent_diff`` and
``cosine`` of successive loop states, ``argmax_stable`` (top token unchanged for n loops)
and ``gate`` (the learned exit gate's cumulative exit probability). Each criterion of
``eval.adaptive_criteria`` is its own section; all of them, and the fixed H_eff losses, come
from one pass over the loops per batch (:mod:`.sweep_pass`).

Semantics of this one-pass evaluation: every position's state keeps being computed up to H
(later tokens attend to it), and each token's prediction is read out at its own exit loop;
the "loops used" of a token is its exit loop. So the numbers say how much depth each token
needs, not how much compute a cached decoder would save. The threshold that never exits
(0; 1 for gate) reproduces the fixed H-loop result exactly: the adaptive
loss is the fixed loss at H (per-token losses computed as the H_eff sweep computes them)
plus the change of every token that exits early. Every loss carries a per-document
bootstrap standard error and a paired interval against the fixed loss at H.

This module holds what a criterion's sweep is (:class:`AdaptiveSpec`) and what it gives
(:class:`AdaptiveLosses`, :func:`adaptive_section`); :mod:`.exit_runs` scores the exits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError
from ..spec.names import IGNORE_INDEX
from ..spec.rules import adaptive_criteria, check_exit_threshold, criterion_thresholds
from .exit_criteria import (  # noqa: F401 (adaptive_logits, parse_adaptive: public here too)
    CRITERIA,
    adaptive_logits,
    parse_adaptive,
)
from .heff_stats import DocumentLosses
from .stats import bootstrap_stderr, document_bootstrap, paired_column_diffs

log = logging.getLogger(__name__)


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


def adaptive_section(result: AdaptiveLosses, reference: DocumentLosses | None = None
                     ) -> dict[str, Any]:
    """The ``adaptive`` section of a sweep JSON (docs/evaluation.md).

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
