"""What an adaptive-exit sweep gives: per-document losses and the sweep JSON's section.

Per criterion, column 0 is the fixed loss at H and column 1+k the loss with every token read
out at its exit under threshold k (:class:`AdaptiveLosses`): what each token needs. The
same columns for the cached decoder's replay under each ``kv_fill`` (:mod:`.replay`) say
what it spends. :func:`adaptive_section` turns them into one section of
``adaptive_by_criterion`` (docs/evaluation.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...spec.names import IGNORE_INDEX
from ..heff_stats import DocumentLosses
from ..stats import bootstrap_stderr, document_bootstrap, paired_column_diffs
from .spec import ExitSpec

log = logging.getLogger(__name__)


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

    spec: ExitSpec
    documents: DocumentLosses
    loops_used: list[int]  # Σ exit loops over scored tokens, per threshold
    # kv_fill → the same sums for the cached decoder's replay (:mod:`.replay`): what it spends
    spent: dict[str, AdaptiveLosses] = field(default_factory=dict)
    kv_bytes_per_token: int | None = None  # the replay's cache (None: nothing replayed)
    # labelled packs: per document Σ label hits at the exit under threshold k (column k)
    # and Σ exit loops (column K + k), with levels and keys (:mod:`..label_accuracy`)
    labels: DocumentLosses | None = None

    @property
    def tokens(self) -> int:
        return self.documents.total_tokens


def _point_stats(result: AdaptiveLosses, fixed: float) -> tuple[float, list[dict[str, Any]]]:
    """(bootstrap standard error of column 0, per threshold: loss (``fixed`` plus the summed
    change of the tokens that exit early: exactly ``fixed`` when none does), its ``stderr``,
    ``mean_loops`` and the paired difference to column 0 (``vs_fixed``))."""
    docs = result.documents
    T = docs.total_tokens
    sums = docs.loss_sums.sum(axis=0)  # [K+1]
    reps = document_bootstrap(docs.loss_sums, docs.tokens)  # [iters, K+1]
    stderr = bootstrap_stderr(reps)
    diffs = paired_column_diffs(reps, sums / T, 0)
    return float(stderr[0]), [
        {"loss": float(fixed + (sums[k + 1] - sums[0]) / T), "stderr": float(stderr[k + 1]),
         "mean_loops": result.loops_used[k] / T, "vs_fixed": diffs[k + 1].to_json()}
        for k in range(len(result.spec.thresholds))]


def adaptive_section(result: AdaptiveLosses, reference: DocumentLosses | None = None
                     ) -> dict[str, Any]:
    """The ``adaptive`` section of a sweep JSON (docs/evaluation.md).

    Per threshold: loss, its per-document bootstrap ``stderr``, ``mean_loops`` used and the
    paired difference to the fixed loss at H (``vs_fixed``: diff and 95% interval), and under
    ``spent`` the same numbers per ``kv_fill`` of the cached decoder's replay. The loss is the
    fixed loss at H plus the summed change of the tokens that exit early, so a threshold
    under which no token exits early (always 0) reproduces the fixed loss exactly;
    ``reference`` (the H_eff sweep's documents, when it covers H) supplies that fixed loss.
    """
    spec, docs = result.spec, result.documents
    T = docs.total_tokens
    fixed = docs.loss_sums.sum(axis=0)[0] / T
    if reference is not None and spec.max_loops in reference.h_effs:
        if reference.total_tokens != T:
            raise ValueError(f"reference sweep scored {reference.total_tokens} tokens, the "
                             f"adaptive sweep {T}: they must read the same batches")
        fixed = reference.means()[spec.max_loops]
    fixed_stderr, stats = _point_stats(result, fixed)
    spent = {fill: _point_stats(r, fixed)[1] for fill, r in result.spent.items()}
    points = []
    for k, x in enumerate(spec.thresholds):
        point = {"threshold": x, **stats[k], "tokens": T}
        if spent:
            point["spent"] = {fill: s[k] for fill, s in spent.items()}
        points.append(point)
    log.info("adaptive exit (%s, max %d loops): %s", spec.criterion, spec.max_loops,
             [(p["threshold"], round(p["loss"], 4), round(p["mean_loops"], 2)) for p in points])
    for fill, s in spent.items():
        log.info("  spent by a cached decoder, kv_fill %s: %s", fill,
                 [(x, round(p["loss"], 4), round(p["mean_loops"], 2))
                  for x, p in zip(spec.thresholds, s, strict=True)])
    section = {"criterion": spec.criterion, "max_loops": spec.max_loops,
               "fixed_loss": float(fixed), "fixed_stderr": fixed_stderr,
               "tokens": T, "documents": int(len(docs.tokens)), "points": points}
    if result.kv_bytes_per_token is not None:
        section["kv_bytes_per_token"] = result.kv_bytes_per_token
    return section
