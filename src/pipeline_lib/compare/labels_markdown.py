"""Markdown of the labelled depth check (:func:`.labels.labels_depth_check`, also read back
from ``compare/labels_depth.json``): accuracy tables by level × H_eff, the paired
comparisons and the targets' verdicts. The docs page shows every level; the front page the
top training level and the hardest one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .labels import top_trained_level

KIND_NAMES = {"looped": "looped", "shallow": "1 block × 1 loop", "deep": "deep", None: "unknown"}
_MET = {True: "**met**", False: "**not met**", None: "**not checked**"}


def _cell(row: Mapping[str, Any], best: bool) -> str:
    text = f"{row['accuracy']:.3f}"
    if row.get("ci_low") is not None:
        text += f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    return f"**{text}**" if best else text


def _level_title(check: Mapping[str, Any], level: int) -> str:
    rows = [r for r in check["table"] if r["level"] == level]
    if any(r["beyond_training"] for r in rows):
        where = "beyond training"
    else:
        where = "top training level" if level == top_trained_level(check) else "in training"
    return f"Level {level} ({where}{', hardest' if level == check['hardest_level'] else ''})"


def level_table(check: Mapping[str, Any], level: int) -> list[str]:
    """Variants (looped, 1 loop, deep) × H_eff at ``level``: token accuracy [95% interval],
    the best H_eff in bold, with the documents and tokens behind it."""
    rows = [r for r in check["table"] if r["level"] == level]
    hs = sorted({r["h_eff"] for r in rows})
    lines = ["| variant | kind | documents | tokens | "
             + " | ".join(f"H_eff={h}" for h in hs) + " |",
             "|---|---|---|---|" + "---|" * len(hs)]
    for run in check["runs"]:
        mine = {r["h_eff"]: r for r in rows if r["variant"] == run}
        if not mine:
            continue
        first = next(iter(mine.values()))
        cells = [_cell(mine[h], h == first["best_h_eff"]) if h in mine else "–" for h in hs]
        lines.append(f"| {run} | {KIND_NAMES[check['kinds'][run]]} | {first['documents']} | "
                     f"{first['tokens']} | " + " | ".join(cells) + " |")
    return lines


def accuracy_tables(check: Mapping[str, Any], levels: Sequence[int] | None = None,
                    level: int = 3) -> list[str]:
    """One :func:`level_table` per level of ``levels`` (default: every level), headed."""
    h = "#" * level
    levels = levels if levels is not None else sorted(
        {r["level"] for r in check["table"] if r["level"] is not None})
    lines: list[str] = []
    for lv in levels:
        lines += ["", f"{h} {_level_title(check, lv)}", "", *level_table(check, lv)]
    return lines


def _acc(value: float, lo: float, hi: float) -> str:
    return f"{value:.3f} [{lo:.2f}, {hi:.2f}]"


def comparison_table(check: Mapping[str, Any]) -> list[str]:
    """The paired comparisons: one row per level × setting × baseline."""
    lines = ["| level | looped at | against | documents | tokens | accuracy | their accuracy | "
             "Δ [95%] | exact match (theirs) | McNemar p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in check["comparisons"]:
        level = f"{c['level']}{' (beyond)' if c['beyond_training'] else ''}"
        mine = f"{c['variant']} H_eff={c['h_eff']} ({c['setting']})"
        other = f"{c['other']} H_eff={c['other_h_eff']} ({c['against']})"
        if "diff" not in c:
            lines.append(f"| {level} | {mine} | {other} | {c['documents']} | – | – | – | – | – "
                         f"| – | {c['verdict']} |")
            continue
        lines.append(
            f"| {level} | {mine} | {other} | {c['documents']} | {c['tokens']} | "
            f"{_acc(c['accuracy'], c['ci_low'], c['ci_high'])} | "
            f"{_acc(c['other_accuracy'], c['other_ci_low'], c['other_ci_high'])} | "
            f"{c['diff']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] | "
            f"{c['exact_match']:.3f} ({c['other_exact_match']:.3f}) | {c['p_mcnemar']:.2g} | "
            f"{c['verdict']} |")
    return lines


def adaptive_table(check: Mapping[str, Any], run: str, criterion: str) -> list[str]:
    """Adaptive exit of one looped variant by level: per threshold, the accuracy at the loop
    each token exited and the mean of those loops (harder levels should exit later)."""
    points = check["adaptive"][run][criterion]
    thresholds = sorted(points, key=float)
    levels = sorted({int(lv) for p in points.values() for lv in p["levels"]})
    lines = ["| level | " + " | ".join(f"{criterion} < {float(t):g}" if float(t) else
                                       "never exits" for t in thresholds) + " |",
             "|---|" + "---|" * len(thresholds)]
    for lv in levels:
        cells = []
        for t in thresholds:
            cell = points[t]["levels"].get(str(lv))
            cells.append("–" if cell is None else
                         f"{cell['accuracy']:.3f} at {cell['mean_loops']:.1f} loops")
        beyond = " (beyond)" if lv > check["train_max_level"] else ""
        lines.append(f"| {lv}{beyond} | " + " | ".join(cells) + " |")
    return lines


def target_lines(check: Mapping[str, Any]) -> list[str]:
    """One bullet per target: met / not met / not checked, with its numbers; then the notes."""
    lines = [f"- {_MET[t['met']]} · {t['variant']}: {t['text']}" for t in check["targets"]]
    return lines + [f"- {note}" for note in check.get("notes", [])]


def labels_markdown(check: Mapping[str, Any], level: int = 2, figure: str | None = None,
                    levels: Sequence[int] | None = None, comparisons: bool = True) -> list[str]:
    """The labelled section: accuracy tables (``levels``; default every level), ``figure``
    (a link) when given, the paired comparisons (unless ``comparisons`` is False) and the
    targets' verdicts; ``level`` is the heading level."""
    h = "#" * level
    met = sum(t["met"] is True for t in check["targets"])
    lines = [f"{h} Labelled task: accuracy by level and test-time loops (H_eff)", "",
             "Token accuracy of each variant's final snapshot on the held-out labelled "
             "documents [95% interval], best H_eff in bold; levels above "
             f"{check['train_max_level']} lie beyond the training range."]
    lines += accuracy_tables(check, levels, level + 1)
    if figure:
        lines += ["", f"![accuracy vs H_eff by level, every variant]({figure})"]
    if comparisons:
        lines += ["", f"{h}# Depth check on the labelled task", "",
                  "Each looped variant at its best H_eff and at its training maximum against "
                  "every 1-block 1-loop and every deep variant at THEIR best H_eff, on the same "
                  "documents of each level. Accuracy is token-weighted (Σ correct / Σ tokens); "
                  "Δ: the paired difference [95% bootstrap over documents]; \"better\" or "
                  "\"worse\" only where that interval excludes zero. McNemar: exact match per "
                  "document.", "", *comparison_table(check)]
    lines += ["", f"{h}# Targets ({met} of {len(check['targets'])} met)", "",
              *target_lines(check)]
    if comparisons:  # the docs page, not the front page
        for run, criteria in (check.get("adaptive") or {}).items():
            for criterion in criteria:
                lines += ["", f"{h}# Adaptive exit by level: {run}, {criterion}", "",
                          "Each token stops looping once its criterion falls below the "
                          "threshold (at most the sweep's largest H_eff): token accuracy at the "
                          "loop it stopped, and the mean of those loops, per level.", "",
                          *adaptive_table(check, run, criterion)]
    return lines
