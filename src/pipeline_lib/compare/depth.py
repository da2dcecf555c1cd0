"""Depth check: does a looped variant at its training loop count beat the shallow baselines?

Variant kinds come from each run's config, never from its name: *looped* (``model.loops``
> 1, or loop counts sampled in training up to ``train.loop_sampling.max_loops`` > 1), *shallow* (one core block, one loop) and *deep* (``model.core_layers`` > 1, one loop:
the iso-FLOP baseline of a looped variant). For every looped variant, every built-in task
and every level inside its training range (level ≤ ``train_max_difficulty`` of its bench
JSON), its accuracy at H_eff = training loops is compared with its own H_eff=1 and with
every shallow and deep variant at H_eff=1, on the SAME examples: the built-in benchmark sets
depend only on ``bench.seed`` and the levels, so every variant scores the same ``doc_id``s.

Each comparison records both accuracies with their 95% Wilson intervals (and whether those
overlap), the paired mean difference with its 95% paired-bootstrap interval and the exact
McNemar p-value, and a verdict: ``better``/``worse`` only where the paired interval excludes
zero, else ``no significant difference``. The ``targets`` say, per level, whether the
variant clears :data:`TARGET_MARGIN` over its own H_eff=1 and over every shallow variant
with disjoint intervals, and reaches at least the lower end of every deep variant's interval.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..evaluate.stats import is_binary, mcnemar_exact, paired_bootstrap, score_interval
from .runs import RunResults

log = logging.getLogger(__name__)
TARGET_MARGIN = 0.15  # absolute accuracy a looped variant should gain over the baselines
OWN, SHALLOW, DEEP = "own H_eff=1", "1 block × 1 loop", "deep"


def variant_kind(run: RunResults) -> str | None:
    """``looped``, ``shallow``, ``deep`` or None (no snapshot config). Sampled loop counts
    (``train.loop_sampling.mode`` uniform or poisson_lognormal) make a variant looped
    whatever ``model.loops`` says."""
    if run.train_loops is None or run.core_layers is None:
        return None
    if max(run.train_loops, run.max_loops or 1) > 1:
        return "looped"
    return "shallow" if run.core_layers == 1 else "deep"


def difference_verdict(lo: float, hi: float) -> str:
    """``better``/``worse`` where the paired 95% interval [lo, hi] excludes zero."""
    if lo > 0:
        return "better"
    if hi < 0:
        return "worse"
    return "no significant difference"


def compare_examples(a: RunResults, h_a: int, b: RunResults, h_b: int, task: str,
                     level: int | None) -> dict[str, Any]:
    """Variant ``a`` at H_eff ``h_a`` against ``b`` at ``h_b`` on the examples of ``task``
    (at ``level``; None: all) that both scored; ``n`` 0 when they share none."""
    sa, sb = a.samples[task], b.samples[task]
    xa, xb = sa.per_sample[h_a], sb.per_sample[h_b]
    ids = sorted(d for d in xa if d in xb and (level is None or (
        sa.levels.get(d) == level and sb.levels.get(d) == level)))
    rec: dict[str, Any] = {"variant": a.name, "h_eff": h_a, "other": b.name, "other_h_eff": h_b,
                           "task": task, "level": level, "n": len(ids)}
    mine = [d for d in xa if level is None or sa.levels.get(d) == level]
    if len(ids) < len(mine):
        log.warning("%s and %s share %d of %d examples of %s level %s: were they benchmarked "
                    "with different bench settings?", a.name, b.name, len(ids), len(mine), task,
                    level)
    if not ids:
        return {**rec, "verdict": "no common examples"}
    x = np.array([xa[d] for d in ids], dtype=np.float64)
    y = np.array([xb[d] for d in ids], dtype=np.float64)
    ci_a, ci_b = score_interval(x), score_interval(y)
    diff = paired_bootstrap(x, y)
    return {**rec, "accuracy": float(x.mean()), "ci_low": ci_a[0], "ci_high": ci_a[1],
            "other_accuracy": float(y.mean()), "other_ci_low": ci_b[0],
            "other_ci_high": ci_b[1], **diff.to_json(),
            "p_mcnemar": mcnemar_exact(x, y) if is_binary(x) and is_binary(y) else None,
            "intervals_overlap": bool(ci_a[0] <= ci_b[1] and ci_b[0] <= ci_a[1]),
            "verdict": difference_verdict(diff.lo, diff.hi)}


def _baseline_h(run: RunResults, task: str) -> int:
    """H_eff 1, or the smallest evaluated when 1 is not."""
    hs = run.samples[task].per_sample
    return 1 if 1 in hs else min(hs)


def _target(records: Sequence[Mapping[str, Any]], margin: float) -> dict[str, Any]:
    """Whether one level's comparisons meet the depth target (see the module docstring)."""
    def clears(rec: Mapping[str, Any]) -> bool:
        return rec["n"] > 0 and rec["diff"] >= margin and not rec["intervals_overlap"]

    by = {kind: [r for r in records if r["against"] == kind] for kind in (OWN, SHALLOW, DEEP)}
    checks = {
        "over_own_h1": all(clears(r) for r in by[OWN]) if by[OWN] else None,
        "over_shallow": all(clears(r) for r in by[SHALLOW]) if by[SHALLOW] else None,
        "vs_deep": all(r["n"] > 0 and r["accuracy"] >= r["other_ci_low"] for r in by[DEEP])
        if by[DEEP] else None,
    }
    met = bool(checks["over_own_h1"]) and all(v is not False for v in checks.values())
    return {**checks, "met": met}


def depth_check(runs: Sequence[RunResults], margin: float = TARGET_MARGIN) -> dict[str, Any]:
    """Every looped variant against itself and the shallow and deep variants (see the module
    docstring): ``{"runs", "kinds", "margin", "comparisons", "targets", "notes"}``."""
    kinds = {r.name: variant_kind(r) for r in runs}
    by_kind = {k: [r for r in runs if kinds[r.name] == k] for k in ("shallow", "deep")}
    comparisons: list[dict[str, Any]] = []
    targets: list[dict[str, Any]] = []
    notes: list[str] = []
    for r in (r for r in runs if kinds[r.name] == "looped"):
        for task, ts in sorted(r.samples.items()):
            if not ts.builtin or not ts.levels:
                continue
            h = r.train_loops
            if h not in ts.per_sample:
                notes.append(f"{r.name}: {task} was not benchmarked at its training loop count "
                             f"H_eff={h}; add it to bench.h_eff")
                continue
            levels = sorted(set(ts.levels.values()))
            in_range = [lv for lv in levels if r.train_max_difficulty is None
                        or lv <= r.train_max_difficulty]
            if r.train_max_difficulty is None:
                notes.append(f"{r.name}: the bench JSON records no train_max_difficulty; every "
                             f"level of {task} is checked")
            others = [(r, OWN)] + [(o, kind) for key, kind in (("shallow", SHALLOW),
                                                                ("deep", DEEP))
                                   for o in by_kind[key] if task in o.samples]
            for level in in_range:
                recs = [{**compare_examples(r, h, o, _baseline_h(o, task), task, level),
                         "against": kind} for o, kind in others]
                comparisons += recs
                targets.append({"variant": r.name, "task": task, "level": level,
                                "hardest_in_range": level == in_range[-1],
                                **_target(recs, margin)})
    if not any(k == "looped" for k in kinds.values()):
        notes.append("no looped variant (model.loops > 1) among the runs")
    return {"runs": [r.name for r in runs], "kinds": kinds, "margin": margin,
            "comparisons": comparisons, "targets": targets, "notes": notes}


# --------------------------------------------------------------------------- markdown


def _acc(value: float | None, lo: float | None, hi: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3f} [{lo:.2f}, {hi:.2f}]" if lo is not None else f"{value:.3f}"


def _row(rec: Mapping[str, Any]) -> str:
    other = (f"own H_eff={rec['other_h_eff']}" if rec["against"] == OWN
             else f"{rec['other']} H_eff={rec['other_h_eff']} ({rec['against']})")
    if rec["n"] == 0:
        return (f"| {rec['task']} | {rec['level']} | 0 | – | {other} | – | "
                f"– | – | {rec['verdict']} |")
    return (f"| {rec['task']} | {rec['level']} | {rec['n']} | "
            f"{_acc(rec['accuracy'], rec['ci_low'], rec['ci_high'])} | "
            f"{other} | "
            f"{_acc(rec['other_accuracy'], rec['other_ci_low'], rec['other_ci_high'])} | "
            f"{rec['diff']:+.3f} [{rec['lo']:+.3f}, {rec['hi']:+.3f}] | "
            f"{'yes' if rec['intervals_overlap'] else 'no'} | {rec['verdict']} |")


def _target_line(task: str, targets: Sequence[Mapping[str, Any]]) -> str:
    met = [str(t["level"]) for t in targets if t["met"]]
    missed = [str(t["level"]) for t in targets if not t["met"]]
    hardest = next((t["level"] for t in targets if t["hardest_in_range"]), None)
    parts = []
    if met:
        parts.append(f"met at level{'s' if len(met) > 1 else ''} {', '.join(met)}")
    if missed:
        parts.append(f"not met at level{'s' if len(missed) > 1 else ''} {', '.join(missed)}")
    return f"- {task}: target {'; '.join(parts)} (hardest in range: {hardest})."


def depth_markdown(check: Mapping[str, Any], level: int = 2) -> list[str]:
    """The "Depth check" section of :func:`depth_check`'s result (also read back from
    ``compare/depth_check.json``); ``level`` is the heading level."""
    h = "#" * level
    lines = [f"{h} Depth check", "",
             "Each looped variant (training loops > 1) at its training loop count against its "
             "own H_eff=1, every 1-block 1-loop variant and every deep variant (core blocks > 1, "
             "one loop) at H_eff=1, on the same examples of each level inside its training "
             "range. Δ: paired mean difference [95% paired-bootstrap interval]; \"better\" or "
             "\"worse\" only where that interval excludes zero. Overlap: whether the two 95% "
             "Wilson intervals overlap."]
    if check.get("notes"):
        lines += [""] + [f"- {note}" for note in check["notes"]]
    margin = check.get("margin", TARGET_MARGIN)
    for variant in check.get("runs", []):
        recs = [c for c in check["comparisons"] if c["variant"] == variant]
        if not recs:
            continue
        lines += ["", f"{h}# {variant} at H_eff={recs[0]['h_eff']}", "",
                  "| task | level | n | accuracy | against | their accuracy | Δ [95%] | "
                  "Wilson overlap | verdict |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [_row(c) for c in recs]
        targets = [t for t in check["targets"] if t["variant"] == variant]
        lines += ["", f"Target: Δ ≥ +{margin:.2f} with disjoint Wilson intervals over its own "
                  "H_eff=1 and every 1-block 1-loop variant, and at least the lower end of every "
                  "deep variant's interval.", ""]
        for task in sorted({t["task"] for t in targets}):
            lines.append(_target_line(task, [t for t in targets if t["task"] == task]))
    return lines


def _against(rec: Mapping[str, Any]) -> str:
    return (f"its own H_eff={rec['other_h_eff']}" if rec["against"] == OWN
            else f"{rec['other']} H_eff={rec['other_h_eff']}")


def _where(recs: Sequence[Mapping[str, Any]]) -> str:
    """``task level 4`` / ``task levels 2, 4`` for each task of ``recs``."""
    by_task: dict[str, list[str]] = {}
    for rec in recs:
        levels = by_task.setdefault(rec["task"], [])
        if str(rec["level"]) not in levels:
            levels.append(str(rec["level"]))
    return "; ".join(f"{task} level{'s' if len(lv) > 1 else ''} {', '.join(lv)}"
                     for task, lv in by_task.items())


def depth_summary(check: Mapping[str, Any]) -> list[str]:
    """A few lines of :func:`depth_check`'s result for a front page: per looped variant, its
    paired comparisons counted by verdict (where each significant one lies) and, per task,
    whether the target is met; the check's notes when it compared nothing."""
    lines: list[str] = []
    for variant in check.get("runs", []):
        recs = [c for c in check["comparisons"] if c["variant"] == variant]
        if not recs:
            continue
        against = list(dict.fromkeys(_against(c) for c in recs))
        counts = []
        for verdict in ("better", "worse", "no significant difference", "no common examples"):
            hits = [c for c in recs if c["verdict"] == verdict]
            if hits:
                where = f" ({_where(hits)})" if verdict in ("better", "worse") else ""
                counts.append(f"{len(hits)} {verdict}{where}")
        lines.append(f"- **{variant}** at H_eff={recs[0]['h_eff']} against "
                     f"{', '.join(against[:-1])}{' and ' if len(against) > 1 else ''}"
                     f"{against[-1]}, on the same examples of each level in its training range "
                     f"({len(recs)} paired comparisons): {', '.join(counts)}.")
        targets = [t for t in check["targets"] if t["variant"] == variant]
        for task in sorted({t["task"] for t in targets}):
            lines.append("  " + _target_line(task, [t for t in targets if t["task"] == task]))
    if not lines:
        lines = [f"- {note}" for note in check.get("notes", [])]
    return lines
