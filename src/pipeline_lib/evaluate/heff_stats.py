"""Per-document loss sums of an H_eff sweep and the statistics drawn from them (no torch).

The sweep scores tokens, but tokens of one document are not independent samples, so the
standard error of the token-weighted mean loss resamples whole documents
(:func:`~pipeline_lib.evaluate.stats.document_bootstrap`). The same resamples serve every
H_eff, which makes the differences loss(h) − loss(1) paired.

A document is the packed document a token belongs to (``batch["doc_index"]``, global) when
the loader provides it; otherwise the piece of a row (row, ``doc_ids``), so a document split
across rows counts as several (slightly too small an interval, never a wrong mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import (
    BOOTSTRAP_ITERS,
    BOOTSTRAP_SEED,
    bootstrap_stderr,
    document_bootstrap,
    paired_column_diffs,
)


@dataclass
class DocumentLosses:
    """Summed token losses per document and H_eff; what the sweep's intervals rest on."""

    h_effs: list[int]  # sorted loop counts, the columns of loss_sums
    loss_sums: np.ndarray  # float64 [docs, len(h_effs)]: Σ per-token loss (nats)
    tokens: np.ndarray  # int64 [docs]: scored targets
    levels: np.ndarray | None = None  # int64 [docs], -1 = unknown; None: no level information
    keys: np.ndarray | None = None  # int64 [docs]: each document's key (the global doc_index
    # when batches carry it, see :func:`~.exit.results.document_keys`); None: not kept

    @property
    def total_tokens(self) -> int:
        return int(self.tokens.sum())

    def means(self) -> dict[int, float]:
        """Token-weighted mean loss per H_eff (= the loss over all scored tokens at once)."""
        total = self.loss_sums.sum(axis=0) / max(self.total_tokens, 1)
        return {h: float(total[j]) for j, h in enumerate(self.h_effs)}

    def subset(self, mask: np.ndarray) -> DocumentLosses:
        return DocumentLosses(self.h_effs, self.loss_sums[mask], self.tokens[mask],
                              None if self.levels is None else self.levels[mask],
                              None if self.keys is None else self.keys[mask])


class DocumentAccumulator:
    """Collects (document key, per-token losses) batch by batch; :meth:`finish` merges them.
    Any per-token values sum the same way (label hits, exit loops: :mod:`.label_accuracy`)."""

    def __init__(self, h_effs: Sequence[int]) -> None:
        self.h_effs = sorted(int(h) for h in h_effs)
        self._keys: list[np.ndarray] = []
        self._sums: list[np.ndarray] = []
        self._counts: list[np.ndarray] = []

    def add(self, keys: np.ndarray, token_losses: np.ndarray) -> None:
        """``keys`` int64 [N] document of each scored token; ``token_losses`` [N, H]."""
        if len(keys) == 0:
            return
        uniq, inverse = np.unique(keys, return_inverse=True)
        sums = np.zeros((len(uniq), len(self.h_effs)), dtype=np.float64)
        np.add.at(sums, inverse, np.asarray(token_losses, dtype=np.float64))
        self._keys.append(uniq)
        self._sums.append(sums)
        self._counts.append(np.bincount(inverse, minlength=len(uniq)).astype(np.int64))

    def finish(self, key_levels: np.ndarray | None = None) -> DocumentLosses:
        """Merge the batches (a document may span several); ``key_levels[key]`` = its level."""
        if not self._keys:
            empty = np.zeros((0, len(self.h_effs)))
            return DocumentLosses(self.h_effs, empty, np.zeros(0, np.int64),
                                  keys=np.zeros(0, np.int64))
        keys = np.concatenate(self._keys)
        uniq, inverse = np.unique(keys, return_inverse=True)
        sums = np.zeros((len(uniq), len(self.h_effs)), dtype=np.float64)
        np.add.at(sums, inverse, np.concatenate(self._sums))
        tokens = np.bincount(inverse, weights=np.concatenate(self._counts),
                             minlength=len(uniq)).astype(np.int64)
        levels = None
        if key_levels is not None:
            levels = np.asarray(key_levels, dtype=np.int64)[uniq]
        return DocumentLosses(self.h_effs, sums, tokens, levels, uniq)


def _stats_block(docs: DocumentLosses, base: int, iters: int, seed: int) -> dict[str, Any]:
    """stderr per H_eff and paired differences against H_eff ``base`` of one set of documents."""
    hs = docs.h_effs
    reps = document_bootstrap(docs.loss_sums, docs.tokens, iters, seed)  # [iters, H]
    se = bootstrap_stderr(reps)
    point = np.array([docs.means()[h] for h in hs])
    diffs = paired_column_diffs(reps, point, hs.index(base))
    return {
        "stderr": {str(h): float(se[j]) for j, h in enumerate(hs)},
        "documents": int(len(docs.tokens)),
        "paired": {str(h): diffs[j].to_json() for j, h in enumerate(hs) if h != base},
    }


def loss_statistics(docs: DocumentLosses, iters: int = BOOTSTRAP_ITERS,
                    seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """The sweep JSON's statistics: ``stderr``, ``documents``, ``paired`` (vs the smallest
    H_eff, normally 1, named in ``paired_baseline``) and, when documents carry levels,
    ``losses_by_level`` {level: {losses, tokens, stderr, documents, paired}}."""
    base = docs.h_effs[0]
    out: dict[str, Any] = {"paired_baseline": base, **_stats_block(docs, base, iters, seed)}
    if docs.levels is not None and (docs.levels >= 0).any():
        by_level = {}
        for level in sorted(int(lv) for lv in np.unique(docs.levels) if lv >= 0):
            part = docs.subset(docs.levels == level)
            by_level[str(level)] = {"losses": {str(h): v for h, v in part.means().items()},
                                    "tokens": part.total_tokens,
                                    **_stats_block(part, base, iters, seed)}
        out["losses_by_level"] = by_level
    return out
