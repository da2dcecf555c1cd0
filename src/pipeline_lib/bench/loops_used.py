"""Loops used per token under adaptive exit: counted per document, summarised per task and level.

:class:`LoopsUsed` is what :class:`~pipeline_lib.bench.lm_wrapper.LooplineLM` records while
it scores or generates: for every (task, lm-eval ``doc_id``) how many tokens were read out
after 1, 2, … loops (a token's loops used is its exit loop; at a fixed h_eff, h_eff). The
counts come straight from the loops tensor of the scoring or decoding pass, so any exit
criterion of :mod:`pipeline_lib.evaluate.exit` is counted the same way.

:func:`loops_summary` turns one task's counts into the ``loops`` entry of the bench JSON::

    {"mean": 2.41, "tokens": 366, "max_loops": 3, "hist": {"1": 80, "2": 56, "3": 230},
     "levels": {"1": {"mean": 2.2, "tokens": 120, "hist": {...}}, ...}}

``hist`` has one bin per loop 1..max_loops (zeros included) and its counts sum to
``tokens``: every scored continuation token (every choice of a multiple-choice question)
and every generated token, the final EOS included. Levels come from lm-eval's per-sample
logs (``doc_id`` → level); tasks without levels have no ``levels``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

DocKey = tuple[str, int | None]  # (task name or "unknown", lm-eval doc_id)


class LoopsUsed:
    """Per (task, doc_id): a histogram {loops used: tokens}."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[int | None, Counter[int]]] = {}

    def add(self, task: str | None, doc_id: int | None, loops: Iterable[int]) -> None:
        """Count one token per entry of ``loops`` (each token's loops used)."""
        docs = self._counts.setdefault(task or "unknown", {})
        docs.setdefault(doc_id, Counter()).update(int(x) for x in loops)

    def clear(self) -> None:
        self._counts.clear()

    def tasks(self) -> list[str]:
        return sorted(self._counts)

    def documents(self, task: str) -> dict[int | None, Counter[int]]:
        """{doc_id: {loops used: tokens}} of ``task`` (empty when nothing was counted)."""
        return self._counts.get(task, {})

    def mean_per_task(self) -> dict[str, float]:
        """Mean loops used per token, per task that has counted tokens."""
        out = {}
        for task in self.tasks():
            mean = _mean(_merge(self._counts[task].values()))
            if mean is not None:
                out[task] = mean
        return out


def _merge(counters: Iterable[Counter[int]]) -> Counter[int]:
    total: Counter[int] = Counter()
    for c in counters:
        total.update(c)
    return total


def _mean(hist: Mapping[int, int]) -> float | None:
    tokens = sum(hist.values())
    return sum(loops * n for loops, n in hist.items()) / tokens if tokens else None


def _entry(hist: Mapping[int, int], max_loops: int) -> dict[str, Any]:
    top = max([max_loops, *hist]) if hist else max_loops
    return {"mean": _mean(hist), "tokens": int(sum(hist.values())),
            "hist": {str(t): int(hist.get(t, 0)) for t in range(1, top + 1)}}


def loops_summary(docs: Mapping[int | None, Counter[int]], max_loops: int,
                  doc_levels: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Mean, token count and histogram of loops used over ``docs`` (see the module
    docstring), and per level when ``doc_levels`` ({str(doc_id): level}) is given."""
    out = {**_entry(_merge(docs.values()), max_loops), "max_loops": int(max_loops)}
    if doc_levels:
        by_level: dict[int, Counter[int]] = {}
        for doc_id, hist in docs.items():
            level = doc_levels.get(str(doc_id))
            if level is not None:
                by_level.setdefault(level, Counter()).update(hist)
        out["levels"] = {str(lv): _entry(h, max_loops) for lv, h in sorted(by_level.items())}
    return out
