"""Compute spent per token: loops used under adaptive exit, counted per document and
summarised per task and level, the KV cache of the generative requests and the loops computed
per generated answer.

:class:`LoopsUsed` is what :class:`~pipeline_lib.bench.lm_wrapper.LooplineLM` records while
it scores or generates: for every (task, lm-eval ``doc_id``) how many tokens were read out
after 1, 2, … loops (a token's loops used is its exit loop; at a fixed h_eff, h_eff). The
counts come straight from the loops tensor of the scoring or decoding pass, so any exit
criterion of :mod:`pipeline_lib.evaluate.exit` is counted the same way.

Loops used and loops computed differ by path. A generated token is decoded through the KV
cache (:mod:`pipeline_lib.model.kv_adaptive`): it stops looping at its exit, so its loops
used are the loops computed. A scored token (loglikelihood, rolling) is read out at its exit
by a pass that computes every loop at every position, so it computes ``max_loops`` whatever
its exit. Tokens are therefore counted with ``generated`` set or not, and the summary says
both (``computed_mean``: loops actually computed per token; ``generated_tokens``: how many of
the tokens were generated). The prompts of generative requests are computed at full depth
and are not counted.

:func:`loops_summary` turns one task's counts into the ``loops`` entry of the bench JSON::

    {"mean": 2.41, "tokens": 366, "max_loops": 3, "hist": {"1": 80, "2": 56, "3": 230},
     "generated_tokens": 40, "computed_mean": 2.9,
     "levels": {"1": {"mean": 2.2, "tokens": 120, "hist": {...}, ...}, ...}}

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
    """Per (task, doc_id): a histogram {loops used: tokens}, all tokens and the generated
    ones apart; per task the largest KV cache its generative requests decoded with."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[int | None, Counter[int]]] = {}
        self._generated: dict[str, dict[int | None, Counter[int]]] = {}
        self._cache: dict[str, tuple[int, int]] = {}
        self._answers: Counter[str] = Counter()  # generated answers (samples) per task

    def add(self, task: str | None, doc_id: int | None, loops: Iterable[int],
            generated: bool = False) -> None:
        """Count one token per entry of ``loops`` (each token's loops used); ``generated``:
        decoded through the cache, so those loops are the loops computed."""
        loops = [int(x) for x in loops]
        for counts in (self._counts, self._generated) if generated else (self._counts,):
            docs = counts.setdefault(task or "unknown", {})
            docs.setdefault(doc_id, Counter()).update(loops)

    def add_answer(self, task: str | None, doc_id: int | None = None) -> None:
        """One generated answer (one sample of a request) of ``task`` ended."""
        self._answers[task or "unknown"] += 1

    def loops_per_answer(self, task: str) -> float | None:
        """Loops computed per generated answer of ``task``: every generated token's loops
        (the final EOS included, the prompt's prefill not) summed, over the answers; None
        when the task generated nothing."""
        answers = self._answers.get(task, 0)
        if not answers:
            return None
        hist = _merge(self._generated.get(task, {}).values())
        return sum(loops * n for loops, n in hist.items()) / answers

    def add_cache(self, tasks: Iterable[str | None], nbytes: int, nbytes_core: int) -> None:
        """A generation batch holding requests of ``tasks`` decoded with a cache of
        ``nbytes`` (``nbytes_core`` of it the core blocks'): each task keeps its largest."""
        for task in set(t or "unknown" for t in tasks):
            old = self._cache.get(task, (0, 0))
            self._cache[task] = (max(old[0], nbytes), max(old[1], nbytes_core))

    def cache_bytes(self, task: str) -> dict[str, int]:
        """``{"kv_bytes", "kv_bytes_core"}`` of ``task``'s largest cache; empty when it
        generated nothing (a scoring-only task keeps no cache)."""
        if task not in self._cache:
            return {}
        total, core = self._cache[task]
        return {"kv_bytes": total, "kv_bytes_core": core}

    def clear(self) -> None:
        self._counts.clear()
        self._generated.clear()
        self._cache.clear()
        self._answers.clear()

    def tasks(self) -> list[str]:
        return sorted(self._counts)

    def documents(self, task: str, generated: bool = False) -> dict[int | None, Counter[int]]:
        """{doc_id: {loops used: tokens}} of ``task`` (empty when nothing was counted); only
        its generated tokens when ``generated``."""
        return (self._generated if generated else self._counts).get(task, {})

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


def _entry(hist: Mapping[int, int], max_loops: int,
           generated: Mapping[int, int] | None = None) -> dict[str, Any]:
    top = max([max_loops, *hist]) if hist else max_loops
    tokens = int(sum(hist.values()))
    out = {"mean": _mean(hist), "tokens": tokens,
           "hist": {str(t): int(hist.get(t, 0)) for t in range(1, top + 1)}}
    if generated is not None:  # a scored token computed max_loops, a generated one its own
        made = int(sum(generated.values()))
        spent = sum(t * n for t, n in generated.items()) + (tokens - made) * max_loops
        out.update(generated_tokens=made, computed_mean=spent / tokens if tokens else None)
    return out


def _by_level(docs: Mapping[int | None, Counter[int]], doc_levels: Mapping[str, int]
              ) -> dict[int, Counter[int]]:
    by_level: dict[int, Counter[int]] = {}
    for doc_id, hist in docs.items():
        level = doc_levels.get(str(doc_id))
        if level is not None:
            by_level.setdefault(level, Counter()).update(hist)
    return by_level


def loops_summary(docs: Mapping[int | None, Counter[int]], max_loops: int,
                  doc_levels: Mapping[str, int] | None = None,
                  generated: Mapping[int | None, Counter[int]] | None = None) -> dict[str, Any]:
    """Mean, token count and histogram of loops used over ``docs`` (see the module
    docstring), and per level when ``doc_levels`` ({str(doc_id): level}) is given. With
    ``generated`` (the generated tokens' documents, a part of ``docs``) each entry also has
    ``generated_tokens`` and ``computed_mean``."""
    gen = None if generated is None else _merge(generated.values())
    out = {**_entry(_merge(docs.values()), max_loops, gen), "max_loops": int(max_loops)}
    if doc_levels:
        gen_levels = _by_level(generated or {}, doc_levels)
        out["levels"] = {str(lv): _entry(h, max_loops, None if generated is None
                                         else gen_levels.get(lv, Counter()))
                         for lv, h in sorted(_by_level(docs, doc_levels).items())}
    return out
