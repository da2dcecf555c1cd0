"""Scores of several sampled answers per question: pass@k, maj@k and lm-eval's filters.

A task that samples (``repeats: n`` with ``do_sample``) gets n answers per document. Two ways
to score them, both read back per H_eff and level with 95% intervals over documents:

- loopline's metric ``loopline_samples`` (:func:`sampled_answers`, registered with lm-eval by
  :mod:`.lm_wrapper`; what the built-in generative task uses under ``bench.sampling``): the
  filter keeps all n answers (``take_first_k`` with k = n) and the metric returns, per
  document, ``exact_match`` of the first answer (lm-eval's default ``take_first``) and for
  every k of its ``k:`` list ``pass@k``, the unbiased estimator of Chen et al. 2021
  (arXiv:2107.03374) from the n answers, c of them right: 1 − C(n−c, k)/C(n, k), and
  ``maj@k`` (k > 1; maj@1 is ``exact_match``), whether the most frequent of the first k
  answers is right (lm-eval's ``majority_vote``: ties go to the answer seen first). A user task may name the metric too.
- lm-eval's own filters (``filter_list`` with ``take_first``, ``take_first_k``,
  ``majority_vote``): every filter but the first is scored as ``{metric}/{filter}`` (e.g.
  ``exact_match/maj@8``) from the per-sample logs.

Each score says how many sampled answers it rests on (``samples``: k for pass@k and maj@k,
a filter's ``take_first_k`` k, all ``repeats`` for a ``majority_vote`` over every answer, 1
otherwise), so compute per answer is ``samples`` × the loops computed per sampled answer
(:meth:`.loops_used.LoopsUsed.loops_per_answer`). pass@k below n is a mean of fractions: its
interval is the percentile bootstrap over documents; maj@k (0/1) has Wilson's.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from math import prod
from typing import Any

from ..errors import ConfigError
from ..spec.names import SAMPLES_METRIC
from .intervals import interval_fields
from .scoring import level_value, scored_samples

SAMPLED_LABEL = re.compile(r"(pass|maj)@(\d+)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k answers drawn without replacement from n, c of them
    right, is right: 1 − C(n−c, k)/C(n, k) (exact, as a product)."""
    if n - c < k:
        return 1.0
    return 1.0 - prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority(answers: Sequence[Any]) -> Any:
    """The most frequent answer, ties to the one seen first (lm-eval's ``majority_vote``)."""
    return Counter(answers).most_common(1)[0][0]


def sampled_answers(references: Sequence[Any], predictions: Sequence[Any],
                    k: int | Sequence[int] = (1,)) -> dict[str, float]:
    """The ``loopline_samples`` metric of one document: ``predictions[0]`` its n answers,
    ``references[0]`` the right one (exact match)."""
    gold, answers = references[0], predictions[0]
    answers = [answers] if isinstance(answers, str) else list(answers)
    right = [a == gold for a in answers]
    out = {"exact_match": float(right[0])}
    for kk in [k] if isinstance(k, int) else k:
        if not 1 <= int(kk) <= len(answers):
            raise ConfigError(f"metric {SAMPLES_METRIC}: k={kk} needs 1 <= k <= repeats "
                              f"({len(answers)} answers per question); lower k or raise repeats")
        out[f"pass@{kk}"] = pass_at_k(len(answers), sum(right), int(kk))
        if kk > 1:  # maj@1 is the first answer's exact_match
            out[f"maj@{kk}"] = float(majority(answers[:int(kk)]) == gold)
    return out


def filter_samples(config: Mapping[str, Any], name: str) -> int:
    """How many sampled answers lm-eval's filter ``name`` of a task ``config`` scores."""
    for entry in config.get("filter_list") or []:
        if isinstance(entry, Mapping) and entry.get("name") == name:
            functions = [f for f in entry.get("filter") or [] if isinstance(f, Mapping)]
            for f in functions:
                if f.get("function") == "take_first_k":
                    return int(f.get("k", 1))
            if any(f.get("function") == "majority_vote" for f in functions):
                return int(config.get("repeats") or 1)
    return 1


def _entry(samples: Iterable[Mapping[str, Any]], key: str, label: str, count: int,
           level_field: str | None) -> dict[str, Any]:
    """Value, interval, per-document scores and (``level_field``) per-level scores."""
    samples = [s for s in samples if isinstance(s.get(key), (int, float))]
    per_sample = {str(s["doc_id"]): float(s[key]) for s in samples}
    values = list(per_sample.values())
    if not values:
        return {"per_sample": {}}
    out = {"value": sum(values) / len(values), **interval_fields(values), "samples": count,
           "per_sample": per_sample}
    if level_field is not None:
        by_level: dict[int, list[float]] = {}
        for s in samples:
            if s["doc"].get(level_field) is not None:
                by_level.setdefault(level_value(s["doc"][level_field], level_field),
                                    []).append(float(s[key]))
        out["levels"] = {str(lv): {label: sum(v) / len(v), **interval_fields(v)}
                         for lv, v in sorted(by_level.items())}
    return out


def sampled_scores(samples: Sequence[Mapping[str, Any]], config: Mapping[str, Any],
                   metric: str | None, level_field: str | None) -> dict[str, dict[str, Any]]:
    """The sampled scores of one task at one setting (see the module docstring): label →
    ``{"value", "n", "ci_low", "ci_high", "samples", "per_sample", "levels"}``; empty when
    the task samples nothing to score. ``level_field`` None: no level breakdown."""
    primary = scored_samples(samples)
    out: dict[str, dict[str, Any]] = {}
    keys = sorted({k for s in primary for k in s if SAMPLED_LABEL.fullmatch(k)},
                  key=lambda k: (SAMPLED_LABEL.fullmatch(k)[1], int(SAMPLED_LABEL.fullmatch(k)[2])))
    for key in keys:
        out[key] = _entry(primary, key, key, int(SAMPLED_LABEL.fullmatch(key)[2]), level_field)
    chosen = primary[0].get("filter", "none") if primary else None
    if metric is not None:
        for name in dict.fromkeys(s.get("filter", "none") for s in samples):
            if name != chosen:
                label = f"{metric}/{name}"
                out[label] = _entry([s for s in samples if s.get("filter", "none") == name],
                                    metric, label, filter_samples(config, name), level_field)
    return {label: entry for label, entry in out.items() if entry["per_sample"]}
