"""Label accuracy of a labelled pack's H_eff sweep: the sweep JSON's ``labels`` section and
the adaptive exit's per-level accuracy (no torch).

On a labelled pack every scored token carries a label (``targets[b, i]`` = the label of input
token i), so the sweep counts, per document, the tokens whose top readout token is the label
(:mod:`.sweep_pass`, one pass). Counts stay integers: accuracy = Σ correct / Σ tokens, exact.
Tokens of one document are not independent, so an accuracy's 95% interval resamples whole
documents (:func:`~.stats.document_bootstrap`, the sweep's seed); an exact-match rate is a
proportion of documents, with a Wilson interval (:func:`~.stats.wilson_interval`).

Levels past the training depth (level > max of the pack's ``train_levels``) are where a
looped model would have to extrapolate: more loops at test time than it trained with
(``train_max_loops``) may or may not buy them accuracy, and past the best H_eff accuracy may
fall again (``drop_after_best``: overthinking).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .heff_stats import DocumentLosses
from .stats import document_bootstrap, percentile_interval, wilson_interval


def _counts(docs: DocumentLosses) -> np.ndarray:
    """Per-document integer sums [docs, C] (sums of 0/1 and of loop counts in float64: exact)."""
    return np.rint(docs.loss_sums).astype(np.int64)


def _by_level(docs: DocumentLosses) -> list[tuple[int, DocumentLosses]]:
    """(level, its documents) for every known level (≥ 0), ascending."""
    if docs.levels is None:
        return []
    return [(int(lv), docs.subset(docs.levels == lv)) for lv in np.unique(docs.levels)
            if lv >= 0]


def _interval(docs: DocumentLosses, correct: np.ndarray) -> list[list[float]]:
    """95% document-bootstrap interval [lo, hi] of Σ correct / Σ tokens, per column."""
    lo, hi = percentile_interval(document_bootstrap(correct, docs.tokens))
    return [[float(a), float(b)] for a, b in zip(lo, hi, strict=True)]


def accuracy_block(docs: DocumentLosses) -> dict[str, Any]:
    """Accuracy, exact match and their intervals at every H_eff of ``docs`` (label hits per
    document and H_eff), the best H_eff and the drop from it to the largest H_eff."""
    hs, correct, tokens = docs.h_effs, _counts(docs), docs.tokens
    total = int(tokens.sum())
    accuracy = {h: int(correct[:, j].sum()) / total for j, h in enumerate(hs)}
    exact = [int((correct[:, j] == tokens).sum()) for j in range(len(hs))]
    n_docs = len(tokens)
    best = min(hs, key=lambda h: (-accuracy[h], h))
    return {
        "documents": n_docs, "tokens": total,
        "accuracy": {str(h): accuracy[h] for h in hs},
        "accuracy_ci": dict(zip(map(str, hs), _interval(docs, correct), strict=True)),
        "exact_match": {str(h): k / n_docs for h, k in zip(hs, exact, strict=True)},
        "exact_match_ci": {str(h): list(wilson_interval(k, n_docs))
                           for h, k in zip(hs, exact, strict=True)},
        "best_h_eff": best, "best_accuracy": accuracy[best],
        "drop_after_best": accuracy[best] - accuracy[hs[-1]],
    }


def label_section(docs: DocumentLosses, train_levels: Sequence[int],
                  train_max: int) -> dict[str, Any]:
    """The sweep JSON's ``labels`` section (docs/evaluation.md) of the label hits per document
    and H_eff ``docs``; ``train_levels``: the pack's training levels, ``train_max``: the
    snapshot's deepest training loop count (:func:`~pipeline_lib.model.loop_sampling.deepest_loops`). Documents of unknown
    level (-1) count in ``all`` only."""
    top = max(train_levels, default=None)
    keys = docs.keys if docs.keys is not None else np.arange(len(docs.tokens))
    levels = docs.levels if docs.levels is not None else np.full(len(docs.tokens), -1)
    correct = _counts(docs)
    return {
        "train_levels": [int(lv) for lv in train_levels],
        "train_max_loops": int(train_max),
        "levels": {str(lv): {"beyond_training": top is not None and lv > top,
                             **accuracy_block(part)} for lv, part in _by_level(docs)},
        "all": accuracy_block(docs),
        "per_document": {"doc_index": keys.tolist(), "level": levels.tolist(),
                         "tokens": docs.tokens.tolist(),
                         "correct": {str(h): correct[:, j].tolist()
                                     for j, h in enumerate(docs.h_effs)}},
    }


def _exit_block(docs: DocumentLosses, counts: np.ndarray, k: int, K: int,
                reps_ci: list[list[float]]) -> dict[str, Any]:
    total = int(docs.tokens.sum())
    return {"accuracy": int(counts[:, k].sum()) / total, "accuracy_ci": reps_ci[k],
            "mean_loops": int(counts[:, K + k].sum()) / total, "tokens": total}


def exit_label_section(thresholds: Sequence[float], docs: DocumentLosses) -> dict[str, Any]:
    """``labels`` of one ``adaptive_by_criterion`` section: per threshold (key ``str(float)``),
    the label accuracy at each token's exit, its interval, the mean loops spent and the
    tokens, per level and over ``all``. ``docs``: per document Σ hits under threshold k in
    column k and Σ exit loops in column K + k (:attr:`~.exit.results.AdaptiveLosses.labels`)."""
    K = len(thresholds)
    parts = [("all", docs), *((str(lv), part) for lv, part in _by_level(docs))]
    counts = {name: _counts(part) for name, part in parts}
    cis = {name: _interval(part, counts[name][:, :K]) for name, part in parts}
    out: dict[str, Any] = {}
    for k, x in enumerate(thresholds):
        blocks = {name: _exit_block(part, counts[name], k, K, cis[name])
                  for name, part in parts}
        all_block = blocks.pop("all")
        out[str(float(x))] = {"levels": blocks, "all": all_block}
    return out
