"""Intervals of benchmark scores and paired comparisons between H_eff values (no torch).

Every H_eff scores the SAME examples (lm-eval's ``doc_id``), so a difference between two
H_eff values is judged per example: the mean of the per-example differences with a 95%
paired-bootstrap interval, and for 0/1 scores the exact McNemar p-value. Two separate
intervals that overlap can still hide a clear paired difference, and the other way round.

The comparisons of one task (``info["paired"]`` in the bench JSON) are records::

    {"h_eff": 4, "against": 1, "level": 3, "n": 200, "diff": 0.12, "lo": 0.05, "hi": 0.19,
     "p_mcnemar": 0.001}

``level`` None is the whole task; ``against`` is the baseline H_eff (1, or the smallest
evaluated) or the previous H_eff in the list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..evaluate.stats import is_binary, mcnemar_exact, paired_bootstrap, score_interval


def interval_fields(values: Sequence[float]) -> dict[str, Any]:
    """{"n", "ci_low", "ci_high"} of a mean score: Wilson for 0/1 scores, else bootstrap."""
    lo, hi = score_interval(values) if len(values) else (float("nan"), float("nan"))
    return {"n": len(values), "ci_low": lo, "ci_high": hi}


def _compare(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    d = paired_bootstrap(a, b)
    p = mcnemar_exact(a, b) if is_binary(a) and is_binary(b) else None
    return {"n": int(len(a)), **d.to_json(), "p_mcnemar": p}


def paired_comparisons(per_h: Mapping[int, Mapping[str, float]],
                       levels: Mapping[str, int] | None = None) -> list[dict[str, Any]]:
    """Every H_eff against the baseline (smallest, normally 1) and against the previous one,
    for the whole task and for each level, on the examples scored at both H_eff values.

    ``per_h``: H_eff → {doc_id: score}; ``levels``: doc_id → level (None: no breakdown).
    """
    hs = sorted(per_h)
    if len(hs) < 2:
        return []
    groups: list[int | None] = [None]
    if levels:
        groups += sorted(set(levels.values()))
    out = []
    for i, h in enumerate(hs[1:], start=1):
        for against in sorted({hs[0], hs[i - 1]}):
            common = sorted(set(per_h[h]) & set(per_h[against]))
            for level in groups:
                ids = [d for d in common if level is None or (levels or {}).get(d) == level]
                if not ids:
                    continue
                a = np.array([per_h[h][d] for d in ids], dtype=np.float64)
                b = np.array([per_h[against][d] for d in ids], dtype=np.float64)
                out.append({"h_eff": h, "against": against, "level": level, **_compare(a, b)})
    return out


def find_comparison(records: Sequence[Mapping[str, Any]], h_eff: int, against: int,
                    level: int | None) -> Mapping[str, Any] | None:
    """The record of (h_eff vs against, level) in ``info["paired"]``, if computed."""
    for rec in records:
        if (rec["h_eff"], rec["against"], rec["level"]) == (h_eff, against, level):
            return rec
    return None
