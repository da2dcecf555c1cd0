"""Markdown pieces of the comparison: variants, loss and accuracy tables, findings.

Each piece is a list of lines with its own heading (``level`` = heading depth), so
``compare/summary.md`` and the docs' generated results sections (:mod:`pipeline_lib.
results_doc`) are made of the same tables.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .answers import answers_table
from .depth import depth_check, depth_markdown
from .labels import LABELS_PLOT
from .labels_markdown import labels_markdown
from .runs import RunResults, Score
from .spent import Spent


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _loss_cell(s: Score | None) -> str:
    if s is None:
        return "–"
    return f"{s.value:.4f}" + (f" ± {s.stderr:.4f}" if s.stderr is not None else "")


def _acc_cell(s: Score | None) -> str:
    if s is None:
        return "–"
    if s.ci_low is None or not math.isfinite(s.ci_low):
        return f"{s.value:.3f}"
    return f"{s.value:.3f} [{s.ci_low:.2f}, {s.ci_high:.2f}]"


def _count(value: int | None) -> str:
    if value is None:
        return "–"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return str(value)


def verdict(diff: Mapping[str, float] | None, higher_is_better: bool) -> str:
    """``deeper is better`` only when the paired 95% interval excludes zero in the right
    direction; ``deeper is worse`` when it excludes zero the other way; else ``no
    significant difference``."""
    if diff is None or diff.get("lo") is None:
        return "no paired interval"
    lo, hi = diff["lo"], diff["hi"]
    if (lo > 0 and higher_is_better) or (hi < 0 and not higher_is_better):
        return "deeper is better"
    if lo > 0 or hi < 0:
        return "deeper is worse"
    return "no significant difference"


def _finding(label: str, diffs: Mapping[int, Mapping[str, float]], higher_is_better: bool,
             digits: int) -> str:
    """One line: the verdict for every H_eff against the baseline, with its interval."""
    groups: dict[str, list[str]] = {}
    for h, d in sorted(diffs.items()):
        text = (f"H_eff={h} ({d['diff']:+.{digits}f} [{d['lo']:+.{digits}f}, "
                f"{d['hi']:+.{digits}f}])")
        groups.setdefault(verdict(d, higher_is_better), []).append(text)
    return f"- {label}: " + "; ".join(f"{v} at {', '.join(items)}" for v, items in groups.items())


def variants_table(runs: Sequence[RunResults], level: int = 2) -> list[str]:
    """Step, parameters, FLOPs per token, core blocks × loops and final training loss."""
    lines = [f"{'#' * level} Variants", "",
             "| run | step | parameters | FLOPs/token (forward) | core blocks × training loops | "
             "final train loss |", "|---|---|---|---|---|---|"]
    for r in runs:
        shape = (f"{r.core_layers or '–'} × {r.train_loops}" if r.train_loops is not None
                 else "–")
        lines.append(f"| {r.name} | {r.final_step} | {_count(r.params)} | "
                     f"{_count(r.flops_per_token)} | {shape} | {_fmt(r.final_train_loss)} |")
    return lines


def loss_table(runs: Sequence[RunResults], level: int = 2) -> list[str]:
    """Validation loss ± standard error at every H_eff, with token and document counts."""
    hs = sorted({h for r in runs for h in r.val_loss})
    lines = [f"{'#' * level} Validation loss by test-time loops (H_eff)", "",
             "Mean loss ± standard error (per-document bootstrap), nats/token.", "",
             "| run | step | tokens (documents) | final train loss | "
             + " | ".join(f"H_eff={h}" for h in hs) + " |",
             "|---|---|---|---|" + "---|" * len(hs)]
    for r in runs:
        tokens = next((s.n for s in r.loss_scores.values() if s.n is not None), None)
        docs = f" ({r.documents})" if r.documents is not None else ""
        if r.initial_scores:  # a model.init_from run: the imported model before training
            lines.append(f"| {r.name} (imported) | 0 | {tokens if tokens is not None else '–'}"
                         f"{docs} | – | " + " | ".join(_loss_cell(r.initial_scores.get(h))
                                                    for h in hs) + " |")
        lines.append(f"| {r.name} | {r.final_step} | {tokens if tokens is not None else '–'}{docs}"
                     f" | {_fmt(r.final_train_loss)} | "
                     + " | ".join(_loss_cell(r.loss_scores.get(h)) for h in hs) + " |")
    return lines


def loss_summary_table(runs: Sequence[RunResults]) -> list[str]:
    """A compact table for a front page: each variant's shape, parameters and final validation
    loss ± standard error at every H_eff (no heading)."""
    hs = sorted({h for r in runs for h in r.val_loss})
    lines = ["| run | core blocks × training loops | parameters | "
             + " | ".join(f"H_eff={h}" for h in hs) + " |", "|---|---|---|" + "---|" * len(hs)]
    for r in runs:
        shape = (f"{r.core_layers or '–'} × {r.train_loops}" if r.train_loops is not None
                 else "–")
        lines.append(f"| {r.name} | {shape} | {_count(r.params)} | "
                     + " | ".join(_loss_cell(r.loss_scores.get(h)) for h in hs) + " |")
    return lines


def accuracy_table(runs: Sequence[RunResults], task: str, level: int = 2) -> list[str]:
    """Accuracy [95% interval] of one task per run and difficulty level at every H_eff;
    levels above a run's training range are marked ``(beyond)``."""
    th = sorted({h for r in runs for h in r.accuracy.get(task, {})})
    head = " | ".join(f"H_eff={h}" for h in th)
    lines = [f"{'#' * level} {task}", "",
             "Accuracy [95% interval]; n = examples per H_eff.", "",
             f"| run | level | n | {head} |", "|---|---|---|" + "---|" * len(th)]
    for r in runs:
        by_level = r.scores.get(task, {})
        if not by_level and task in r.accuracy:  # a bench JSON without intervals
            by_level = {None: {h: Score(v) for h, v in r.accuracy[task].items()}}
        for lv in [None] + sorted(x for x in by_level if x is not None):
            cells = by_level.get(lv, {})
            ns = {s.n for s in cells.values() if s.n is not None}
            n = "/".join(str(x) for x in sorted(ns)) or "–"
            name = "all" if lv is None else f"{lv} (beyond)" if r.beyond_range(task, lv) else lv
            lines.append(f"| {r.name} | {name} | {n} | "
                         + " | ".join(_acc_cell(cells.get(h)) for h in th) + " |")
    return lines


def accuracy_tables(runs: Sequence[RunResults], level: int = 2) -> list[str]:
    """:func:`accuracy_table` of every task any run was benchmarked on."""
    lines: list[str] = []
    for task in sorted({k for r in runs for k in r.accuracy}):
        lines += [""] + accuracy_table(runs, task, level)
    return lines


@dataclass(frozen=True)
class Setting:
    """One depth setting of one run and task: its label in the table (``name``) and in the
    bench JSON (``key``), mean loops used and computed per token, whole-task score, cost
    (:mod:`.spent`); ``computed_known`` False: a bench JSON without loops computed, whose
    ``computed`` is then the loops used."""

    name: str
    key: str
    used: float
    computed: float
    score: Score
    spent: Spent
    adaptive: bool
    computed_known: bool = True


def depth_settings(r: RunResults, key: str) -> list[Setting]:
    """Every setting of run ``r`` on ``task/metric`` ``key``: each fixed H_eff (every token
    used and computed H_eff loops), then each adaptive exit, by loops computed."""
    spent = r.spent.get(key, {})
    fixed = [Setting(f"H_eff={h}", str(h), float(h), float(h),
                     r.scores.get(key, {}).get(None, {}).get(h, Score(v)),
                     spent.get(str(h), Spent()), False)
             for h, v in sorted(r.accuracy.get(key, {}).items())]
    crit = f" ({r.adaptive_criterion})" if r.adaptive_criterion else ""
    adaptive = []
    for label, cells in r.adaptive.get(key, {}).items():
        if None in cells:
            c = cells[None]
            known = c.computed_loops is not None
            adaptive.append(Setting(f"{label}{crit}", label, c.mean_loops,
                                    c.computed_loops if known else c.mean_loops, c.score,
                                    spent.get(label, Spent()), True, known))
    return fixed + sorted(adaptive, key=lambda s: (s.computed, s.used))


def _kv_cell(s: Spent) -> str:
    if s.kv_bytes is None:
        return "–"
    return f"{_count(s.kv_bytes)}B ({_count(s.kv_bytes_core)}B)"


def loops_table(runs: Sequence[RunResults], level: int = 2) -> list[str]:
    """Accuracy against the loops used and computed per token and what each setting spent,
    one row per variant × depth setting, for every task some variant was benchmarked on
    under adaptive exit; empty without any."""
    keys = sorted({k for r in runs for k in r.adaptive})
    if not keys:
        return []
    lines = [f"{'#' * level} Accuracy against compute spent", "",
             "All levels. Loops per scored or generated token: *used* is each token's exit "
             "loop, *computed* what was run for it (a generated token decoded through the KV "
             "cache stops at its exit; a scored token's pass computes every loop up to MAX; a "
             "fixed H_eff uses and computes H_eff loops). KV cache: the largest of the task's "
             "generative requests, all slots (core blocks' slots); – for scoring-only tasks. "
             "Wall time: the whole setting, all tasks together. Accuracy [95% interval].", "",
             "| run | task | depth | loops used | loops computed | accuracy | KV cache (core) | "
             "wall s (all tasks) |", "|---|---|---|---|---|---|---|---|"]
    for key in keys:
        for r in runs:
            for s in depth_settings(r, key):
                computed = f"{s.computed:.2f}" if s.computed_known else "–"
                wall = "–" if s.spent.seconds is None else f"{s.spent.seconds:.1f}"
                lines.append(f"| {r.name} | {key} | {s.name} | {s.used:.2f} | {computed} | "
                             f"{_acc_cell(s.score)} | {_kv_cell(s.spent)} | {wall} |")
    return lines


def findings(runs: Sequence[RunResults], level: int = 2) -> list[str]:
    """Per run: best H_eff, and the paired verdict of every H_eff against the baseline."""
    hs = sorted({h for r in runs for h in r.val_loss})
    lines = [f"{'#' * level} Findings", "",
             "Each H_eff against the baseline H_eff on the SAME documents (loss) or examples "
             "(accuracy): mean paired difference [95% bootstrap interval]. \"deeper is better\" "
             "only where the interval excludes zero.", ""]
    for r in runs:
        ordered = [r.val_loss[h] for h in sorted(r.val_loss)]
        best_h = min(r.val_loss, key=lambda h: (r.val_loss[h], h)) if r.val_loss else None
        deeper = all(b <= a for a, b in zip(ordered, ordered[1:], strict=False))
        lines.append(f"- **{r.name}**: best validation loss at H_eff={best_h}; more loops at test "
                     f"time {'never hurt' if deeper else 'do not always help'} "
                     f"(loss {' → '.join(_fmt(v) for v in ordered)}).")
        if r.loss_paired:
            lines.append("  " + _finding(f"{r.name} · validation loss vs H_eff={min(r.val_loss)}",
                                         r.loss_paired, False, 4))
        for task, records in sorted(r.paired.items()):
            levels = sorted({rec["level"] for rec in records}, key=lambda x: (x is not None, x))
            for lv in levels:
                diffs = {rec["h_eff"]: rec for rec in records
                         if rec["level"] == lv and rec["against"] == r.baseline}
                if diffs:
                    where = "all levels" if lv is None else f"level {lv}"
                    lines.append("  " + _finding(f"{r.name} · {task} · {where}", diffs, True, 3))
    if hs and runs:
        best = {h: min(runs, key=lambda r: r.val_loss.get(h, float("inf"))).name for h in hs}
        lines.append("- Lowest validation loss per H_eff: "
                     + ", ".join(f"H_eff={h}: {name}" for h, name in best.items()) + ".")
    return lines


def summary_markdown(runs: Sequence[RunResults], depth: Mapping[str, Any] | None = None,
                     labels: Mapping[str, Any] | None = None) -> str:
    """Variants (size, FLOPs), loss and accuracy tables with uncertainties, the depth check
    (``depth``: :func:`.depth.depth_check` of ``runs``, computed when not given), findings;
    opened by the labelled depth check (``labels``: :func:`.labels.labels_depth_check`) when
    some variant has a labelled task."""
    depth = depth_check(runs) if depth is None else depth
    lines = ["# Variant comparison", "",
             "Final snapshot of each variant. Validation loss in nats/token (lower is better); "
             "accuracy is each task's main metric with a 95% interval (Wilson); FLOPs per token "
             "of a forward pass at the variant's training loop count (training ≈ 3×).", ""]
    if labels is not None:
        lines += labels_markdown(labels, figure=LABELS_PLOT) + [""]
    lines += variants_table(runs) + [""] + loss_table(runs) + accuracy_tables(runs)
    loops = loops_table(runs)
    lines += [""] + loops if loops else []
    answers = answers_table(runs)
    lines += [""] + answers if answers else []
    lines += [""] + depth_markdown(depth) + [""] + findings(runs)
    return "\n".join(lines) + "\n"
