"""Depth check on labelled tasks: per-token accuracy by level × H_eff, paired across variants.

A labelled task (sequence labelling: a label per token, levels of difficulty, some beyond the
training range) leaves a ``labels`` section in each run's final H_eff sweep
(``eval/heff/step_….json``): per level and H_eff the token accuracy with its 95% interval,
the best H_eff, and per held-out document its level, tokens and correct tokens at every
H_eff. Variants of one experiment share one data pack, so a ``doc_index`` is the same
document in every variant and comparisons between them are PAIRED.

:func:`labels_depth_check` gives

- ``table``: accuracy (95% interval, exact match, documents, tokens) per variant × level ×
  H_eff, levels beyond the training range marked;
- ``comparisons``: per level, each looped variant at its best H_eff and at H_eff =
  ``train_max_loops`` (one comparison where the two coincide) against every shallow (1 block × 1 loop, iso-parameter) and every deep
  (iso-FLOP) variant, each at ITS best H_eff for that level, on the documents present in
  both: token-weighted accuracies (Σ correct / Σ tokens) with document-bootstrap intervals,
  their difference with a paired 95% document-bootstrap interval (the same resamples for
  both sides, :func:`~pipeline_lib.evaluate.stats.document_bootstrap`), exact match per
  document (Wilson intervals, exact McNemar p-value), and a verdict (``better``/``worse``
  only where the paired interval excludes zero);
- ``targets`` of the depth question (constants below), each with the numbers behind it and
  ``met`` true, false or None (cannot be checked from these results, see ``notes``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DataError
from ..evaluate.stats import (
    document_bootstrap,
    mcnemar_exact,
    paired_column_diffs,
    percentile_interval,
    wilson_interval,
)
from .depth import difference_verdict, variant_kind
from .runs import RunResults

log = logging.getLogger(__name__)
LABELS_JSON = "labels_depth.json"
LABELS_PLOT = "labels_accuracy.png"
SECTION_KEYS = ("train_levels", "train_max_loops", "levels", "all", "per_document")
KIND_ORDER = ("looped", "shallow", "deep", None)  # tables list variants in this order
BASELINES = {"shallow": "1 block × 1 loop", "deep": "deep"}
# Targets (issue 38): the looped variant on the hardest level, beyond training ...
BEYOND_BEST_ACCURACY = 0.95  # best accuracy over H_eff at least this
BEYOND_GAIN_OVER_TRAIN_LOOPS = 0.10  # best minus accuracy at H_eff = train_max_loops
BEYOND_GAIN_OVER_H1 = 0.30  # best minus accuracy at H_eff = 1
# ... inside the training range (every level ≤ the top training level) ...
TRAIN_RANGE_ACCURACY = 0.99  # at H_eff = train_max_loops, every such level
TRAIN_RANGE_MAX_DROP = 0.01  # largest fall from there at any H_eff up to ...
EXTRAPOLATION_FACTOR = 3  # ... this many times train_max_loops
# ... and the shallow variant on the hardest level, at every H_eff
SHALLOW_CEILING = 0.75
_SLACK = 1e-9  # float slack on the bounds: 0.95 − 0.85 is 0.0999…


@dataclass(frozen=True)
class LabelledRun:
    """One variant's labels section, its kind and its documents by ``doc_index``."""

    name: str
    kind: str | None
    labels: Mapping[str, Any]
    level: dict[int, int]  # doc → level
    tokens: dict[int, int]  # doc → labelled tokens
    correct: dict[int, dict[int, float]]  # H_eff → doc → correct tokens

    @classmethod
    def of(cls, run: RunResults) -> LabelledRun:
        labels = run.labels or {}
        missing = [k for k in SECTION_KEYS if k not in labels]
        if missing:
            raise DataError(f"run {run.name}: the labels section of its final H_eff sweep lacks "
                            f"{', '.join(missing)}; rerun its H_eff sweep (eval_heff)")
        docs = labels["per_document"]
        ids = [int(d) for d in docs.get("doc_index", [])]
        columns = [docs.get("level", []), docs.get("tokens", []),
                   *(docs.get("correct") or {}).values()]
        if any(len(c) != len(ids) for c in columns):
            raise DataError(f"run {run.name}: the labels section's per_document lists differ "
                            "in length; rerun its H_eff sweep (eval_heff)")
        return cls(run.name, variant_kind(run), labels,
                   dict(zip(ids, map(int, docs.get("level", [])), strict=True)),
                   dict(zip(ids, map(int, docs.get("tokens", [])), strict=True)),
                   {int(h): dict(zip(ids, map(float, c), strict=True))
                    for h, c in (docs.get("correct") or {}).items()})

    @property
    def train_max_loops(self) -> int:
        return int(self.labels["train_max_loops"])

    @property
    def train_max_level(self) -> int:
        return max(int(lv) for lv in self.labels["train_levels"])

    @property
    def levels(self) -> list[int]:
        return sorted(int(lv) for lv in self.labels["levels"])

    def cell(self, level: int | None) -> Mapping[str, Any]:
        """The section of ``level`` (None: all levels)."""
        return self.labels["all"] if level is None else self.labels["levels"][str(level)]

    def accuracy(self, level: int | None) -> dict[int, float]:
        """H_eff → token accuracy at ``level`` (None: all levels)."""
        return {int(h): float(v) for h, v in self.cell(level)["accuracy"].items()}


def compare_documents(a: LabelledRun, h_a: int, b: LabelledRun, h_b: int,
                      level: int) -> dict[str, Any]:
    """``a`` at H_eff ``h_a`` against ``b`` at ``h_b`` on the documents of ``level`` both
    scored (see the module docstring); ``documents`` 0 when they share none."""
    ids = sorted(d for d, lv in a.level.items() if lv == level and b.level.get(d) == level)
    rec: dict[str, Any] = {"variant": a.name, "h_eff": h_a, "other": b.name,
                           "other_h_eff": h_b, "level": level, "documents": len(ids)}
    mine = sum(lv == level for lv in a.level.values())
    if len(ids) < mine:
        log.warning("%s and %s share %d of %d documents of level %d: do they share one data "
                    "pack?", a.name, b.name, len(ids), mine, level)
    if not ids:
        return {**rec, "verdict": "no common documents"}
    if any(a.tokens[d] != b.tokens[d] for d in ids):
        return {**rec, "verdict": "not the same documents"}  # same index, other token counts
    tokens = np.array([a.tokens[d] for d in ids], dtype=np.float64)
    correct = np.array([[a.correct[h_a][d], b.correct[h_b][d]] for d in ids], dtype=np.float64)
    point = correct.sum(axis=0) / tokens.sum()
    reps = document_bootstrap(correct, tokens)  # the same resampled documents for both sides
    diff = paired_column_diffs(reps, point, base=1)[0]
    exact = correct == tokens[:, None]  # every token of the document right
    exact_a, exact_b = exact[:, 0].astype(np.float64), exact[:, 1].astype(np.float64)
    em_a, em_b = (wilson_interval(float(x.sum()), len(ids)) for x in (exact_a, exact_b))
    (lo_a, lo_b), (hi_a, hi_b) = (map(float, side) for side in percentile_interval(reps[:, :2]))
    return {**rec, "tokens": int(tokens.sum()),
            "accuracy": float(point[0]), "ci_low": lo_a, "ci_high": hi_a,
            "other_accuracy": float(point[1]), "other_ci_low": lo_b, "other_ci_high": hi_b,
            **diff.to_json(),
            "exact_match": float(exact_a.mean()), "exact_match_ci": list(em_a),
            "other_exact_match": float(exact_b.mean()), "other_exact_match_ci": list(em_b),
            "p_mcnemar": mcnemar_exact(exact_a, exact_b),
            "verdict": difference_verdict(diff.lo, diff.hi)}


def _table_rows(run: LabelledRun) -> list[dict[str, Any]]:
    rows = []
    for level in [*run.levels, None]:
        cell = run.cell(level)
        for h, acc in sorted(run.accuracy(level).items()):
            ci = cell.get("accuracy_ci", {}).get(str(h)) or [None, None]
            em_ci = cell.get("exact_match_ci", {}).get(str(h)) or [None, None]
            rows.append({"variant": run.name, "kind": run.kind, "level": level,
                         "beyond_training": bool(cell.get("beyond_training", False)),
                         "h_eff": h, "accuracy": acc, "ci_low": ci[0], "ci_high": ci[1],
                         "exact_match": cell.get("exact_match", {}).get(str(h)),
                         "exact_match_ci_low": em_ci[0], "exact_match_ci_high": em_ci[1],
                         "documents": cell.get("documents"), "tokens": cell.get("tokens"),
                         "best_h_eff": cell.get("best_h_eff")})
    return rows


def _target(run: str, name: str, level: int | None, observed: float | None, bound: float,
            at_least: bool, text: str) -> dict[str, Any]:
    met = None if observed is None else (observed >= bound - _SLACK if at_least
                                         else observed <= bound + _SLACK)
    return {"variant": run, "target": name, "level": level, "observed": observed,
            "threshold": bound, "at_least": at_least, "met": met, "text": text}


def _beyond_targets(run: LabelledRun, hardest: int, notes: list[str]) -> list[dict[str, Any]]:
    """Best accuracy on the hardest level, and its gains over H_eff = train_max_loops and 1."""
    cell = run.cell(hardest) if hardest in run.levels else None
    if cell is None or not cell.get("beyond_training"):
        notes.append(f"{run.name}: the hardest level {hardest} lies inside its training range "
                     "or was not evaluated; the targets beyond training cannot be checked")
        cell = None
    acc = run.accuracy(hardest) if cell is not None else {}
    t = run.train_max_loops
    best = float(cell["best_accuracy"]) if cell is not None else None
    best_h = cell["best_h_eff"] if cell is not None else None
    out = [_target(run.name, "beyond_best_accuracy", hardest, best, BEYOND_BEST_ACCURACY, True,
                   f"best accuracy over H_eff on level {hardest} (beyond training) ≥ "
                   f"{BEYOND_BEST_ACCURACY:.2f}: {_num(best)} at H_eff={best_h}")]
    for name, h, bound in (("beyond_gain_over_train_max_loops", t, BEYOND_GAIN_OVER_TRAIN_LOOPS),
                           ("beyond_gain_over_h1", 1, BEYOND_GAIN_OVER_H1)):
        if cell is not None and h not in acc:
            notes.append(f"{run.name}: level {hardest} was not evaluated at H_eff={h}; add it "
                         "to eval.h_eff")
        gain = best - acc[h] if best is not None and h in acc else None
        out.append(_target(run.name, name, hardest, gain, bound, True,
                           f"best accuracy on level {hardest} ≥ {bound:.2f} above H_eff={h}: "
                           f"{_num(best)} − {_num(acc.get(h))} = {_num(gain, '+.3f')}"))
    return out


def _range_targets(run: LabelledRun, notes: list[str]) -> list[dict[str, Any]]:
    """Accuracy at H_eff = train_max_loops on every level of the training range, and no drop
    from there out to EXTRAPOLATION_FACTOR × train_max_loops."""
    t, top = run.train_max_loops, run.train_max_level
    levels = [lv for lv in run.levels if lv <= top]
    at_t = {lv: run.accuracy(lv).get(t) for lv in levels}
    if not levels or any(v is None for v in at_t.values()):
        notes.append(f"{run.name}: the training range was not evaluated at every level at "
                     f"H_eff={t}; add it to eval.h_eff")
        at_t = {}
    low = min(at_t, key=lambda lv: (at_t[lv], lv)) if at_t else None
    drops = {(lv, h): at_t[lv] - a for lv in at_t for h, a in run.accuracy(lv).items()
             if t < h <= EXTRAPOLATION_FACTOR * t}
    if at_t and not drops:
        notes.append(f"{run.name}: no H_eff in ({t}, {EXTRAPOLATION_FACTOR * t}] was evaluated; "
                     "the no-drop target cannot be checked")
    worst = max(drops, key=lambda k: (drops[k], -k[1])) if drops else None
    hs = sorted({h for _, h in drops})
    return [
        _target(run.name, "train_range_accuracy", low, at_t.get(low), TRAIN_RANGE_ACCURACY, True,
                f"accuracy at H_eff={t} ≥ {TRAIN_RANGE_ACCURACY:.2f} on every level ≤ {top}: "
                f"lowest {_num(at_t.get(low))} (level {low})"),
        _target(run.name, "train_range_no_drop", worst[0] if worst else None,
                drops[worst] if worst else None, TRAIN_RANGE_MAX_DROP, False,
                f"no drop > {TRAIN_RANGE_MAX_DROP:.2f} from H_eff={t} out to "
                f"{EXTRAPOLATION_FACTOR}×{t} (H_eff {', '.join(map(str, hs)) or 'none'}) on "
                f"every level ≤ {top}: largest {_num(drops[worst] if worst else None, '+.3f')}"
                + (f" (level {worst[0]}, H_eff={worst[1]})" if worst else "")),
    ]


def _shallow_target(run: LabelledRun, hardest: int) -> dict[str, Any]:
    acc = run.accuracy(hardest) if hardest in run.levels else {}
    top = max(acc, key=lambda h: (acc[h], -h)) if acc else None
    return _target(run.name, "shallow_ceiling", hardest, acc.get(top), SHALLOW_CEILING, False,
                   f"1 block × 1 loop on level {hardest} ≤ {SHALLOW_CEILING:.2f} at every "
                   f"H_eff: highest {_num(acc.get(top))} (H_eff={top})")


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "–" if value is None else format(value, fmt)


def _comparisons(looped: LabelledRun, baselines: Sequence[LabelledRun],
                 notes: list[str]) -> list[dict[str, Any]]:
    """Per level: ``looped`` at its best H_eff and at train_max_loops against every baseline
    at the baseline's best H_eff of that level."""
    out = []
    t = looped.train_max_loops
    for level in looped.levels:
        best = int(looped.cell(level)["best_h_eff"])
        settings = ({"best H_eff = train_max_loops": t} if best == t
                    else {"best H_eff": best, "train_max_loops": t})
        if t not in looped.accuracy(level):
            notes.append(f"{looped.name}: level {level} was not evaluated at its "
                         f"train_max_loops H_eff={t}")
            del settings["train_max_loops"]
        others = [o for o in baselines if level in o.levels]
        notes += [f"{o.name} has no level {level}; {looped.name} is not compared with it there"
                  for o in baselines if o not in others]
        for setting, h in settings.items():
            for other in others:
                h_other = int(other.cell(level)["best_h_eff"])
                out.append({**compare_documents(looped, h, other, h_other, level),
                            "setting": setting, "against": BASELINES[other.kind],
                            "beyond_training": bool(looped.cell(level).get("beyond_training"))})
    return out


def top_trained_level(check: Mapping[str, Any]) -> int | None:
    """The hardest evaluated level inside the training range of :func:`labels_depth_check`'s
    result (None: every level lies beyond it)."""
    return max((r["level"] for r in check["table"]
                if r["level"] is not None and r["level"] <= check["train_max_level"]),
               default=None)


def labels_depth_check(runs: Sequence[RunResults]) -> dict[str, Any] | None:
    """The labelled depth check (module docstring) of the runs with a labels section; None
    when no run has one."""
    labelled = [LabelledRun.of(r) for r in runs if r.labels]
    if not labelled:
        return None
    labelled.sort(key=lambda r: KIND_ORDER.index(r.kind))  # stable: config order within a kind
    hardest = max(lv for r in labelled for lv in r.levels)
    looped = [r for r in labelled if r.kind == "looped"]
    baselines = [r for r in labelled if r.kind in BASELINES]
    notes: list[str] = []
    comparisons: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    for r in looped:
        comparisons += _comparisons(r, baselines, notes)
        targets += _beyond_targets(r, hardest, notes) + _range_targets(r, notes)
    targets += [_shallow_target(r, hardest) for r in labelled if r.kind == "shallow"]
    for kind, what in (("looped", "looped variant (model.loops > 1 or sampled loops)"),
                       ("shallow", "1 block × 1 loop variant"), ("deep", "deep variant")):
        if not any(r.kind == kind for r in labelled):
            notes.append(f"no labelled {what} among the runs")
    return {"runs": [r.name for r in labelled], "kinds": {r.name: r.kind for r in labelled},
            "train": {r.name: {"levels": sorted(int(lv) for lv in r.labels["train_levels"]),
                               "max_loops": r.train_max_loops} for r in labelled},
            "hardest_level": hardest,
            "train_max_level": max(r.train_max_level for r in labelled),
            "table": [row for r in labelled for row in _table_rows(r)],
            "comparisons": comparisons, "targets": targets,
            "adaptive": {r.name: r.labels["adaptive"] for r in looped if r.labels.get("adaptive")},
            "all_met": bool(targets) and all(t["met"] is True for t in targets),
            "notes": notes}
