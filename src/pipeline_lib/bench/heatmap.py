"""The benchmark summary figure: an accuracy heatmap (difficulty × H_eff) per levelled task,
and one per sampled score of it (pass@k, maj@k, a filter's: :mod:`.sampled`).

Each cell holds the score and its 95% interval, each row its number of examples; with
several snapshot steps a second row of panels shows whole-task accuracy against step, one
line per H_eff. Tasks without levels get one bar panel; reports without tasks (no
benchmarks configured) a figure that says so. Drawn by
:func:`pipeline_lib.bench.scoring.summarize_bench` from the bench JSONs (fixed H_eff only:
adaptive-exit scores are in the table, ``adaptive``/``mean_loops`` columns).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..figures import save_figure

NO_TASKS_NOTE = "no downstream benchmarks configured (bench.tasks is empty)"


def _levels(info: Mapping[str, Any], scores: Mapping[str, Any], metric: str
            ) -> Mapping[str, Any]:
    """{level: {metric, n, ci_low, ci_high}} of ``metric`` at one setting: the task's own
    metric, or one of its sampled scores (pass@k, maj@k, a filter's; :mod:`.sampled`)."""
    if metric == info["metric"]:
        return scores.get("levels", {})
    return (scores.get("sampled") or {}).get(metric, {}).get("levels", {})


def _heatmap_grid(info: Mapping[str, Any], metric: str
                  ) -> tuple[list[int], list[int], list[list[float]]]:
    """(levels, h_effs, score[level][h_eff]) of one task's ``metric``; NaN where missing."""
    h_effs = sorted(int(h) for h in info["h_eff"])
    levels = sorted({int(lv) for s in info["h_eff"].values() for lv in _levels(info, s, metric)})
    grid = [[_levels(info, info["h_eff"][str(h)], metric).get(str(lv), {}).get(metric, math.nan)
             for h in h_effs] for lv in levels]
    return levels, h_effs, grid


def _cell_label(info: Mapping[str, Any], metric: str, h: int, level: int) -> str:
    """``"0.62\n[0.55,0.68]"``: a heatmap cell's score and its 95% interval (when known)."""
    cell = _levels(info, info["h_eff"][str(h)], metric).get(str(level), {})
    text = f"{cell[metric]:.2f}"
    if cell.get("ci_low") is not None and math.isfinite(cell["ci_low"]):
        text += f"\n[{cell['ci_low']:.2f},{cell['ci_high']:.2f}]"
    return text


def _level_label(info: Mapping[str, Any], metric: str, level: int) -> str:
    """Heatmap row label: the level and its number of examples (``3 (n=200)``)."""
    ns = {_levels(info, s, metric).get(str(level), {}).get("n") for s in info["h_eff"].values()}
    ns.discard(None)
    return f"{level} (n={'/'.join(str(n) for n in sorted(ns))})" if ns else str(level)


def _sampled_title(info: Mapping[str, Any], metric: str) -> str:
    """``k sampled answer(s) per question``: the last title line of a sampled score's panel."""
    cells = [(s.get("sampled") or {}).get(metric, {}) for s in info["h_eff"].values()]
    k = next((c["samples"] for c in cells if "samples" in c), None)
    return f"\n{k} sampled answer(s) per question" if k else ""


def _plot_heatmap(ax: Any, task: str, metric: str, latest: Mapping[str, Any],
                  first_col: bool) -> Any:
    """One task's ``metric`` heatmap (difficulty × H_eff) at the latest step; returns the image."""
    info = latest["tasks"][task]
    train_max = latest.get("train_max_difficulty")
    levels, h_effs, grid = _heatmap_grid(info, metric)
    data = np.array(grid, dtype=float)
    image = ax.imshow(data, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
    for i in range(len(levels)):
        for j in range(len(h_effs)):
            if np.isfinite(data[i, j]):
                ax.text(j, i, _cell_label(info, metric, h_effs[j], levels[i]), ha="center",
                        va="center", fontsize=6.5, linespacing=1.1,
                        color="black" if data[i, j] > 0.6 else "white")
    ax.set_xticks(range(len(h_effs)), [str(h) for h in h_effs])
    ax.set_yticks(range(len(levels)), [_level_label(info, metric, lv) for lv in levels],
                  fontsize=7)
    ax.set_xlabel("H_eff (test-time loops)")
    if first_col:
        ax.set_ylabel("difficulty level")
    if train_max is not None and levels and levels[0] <= train_max < levels[-1]:
        edge = levels.index(train_max) + 0.5
        ax.axhline(edge, color="white", linestyle="--", linewidth=1.2)
    chance = info.get("chance")
    suffix = f", chance {chance:.2f}" if chance is not None else ""
    if metric != info["metric"]:
        suffix = _sampled_title(info, metric)
    ax.set_title(f"{task}\n{metric} at step {latest.get('step')}{suffix}", fontsize=9)
    return image


def _plot_other_tasks(ax: Any, latest: Mapping[str, Any], others: list[str]) -> None:
    """Bars of the overall scores of tasks without levels (any lm-eval task)."""
    labels, values = [], []
    for task in others:
        for h, scores in sorted(latest["tasks"][task]["h_eff"].items(), key=lambda x: int(x[0])):
            for metric, value in scores["overall"].items():
                if not metric.endswith("_stderr"):
                    labels.append(f"{task}\n{metric} H={h}")
                    values.append(value)
    ax.barh(range(len(values)), values)
    ax.set_yticks(range(len(values)), labels, fontsize=6)
    ax.set_title("other lm-eval tasks", fontsize=9)


def _plot_trend(ax: Any, task: str, reports: list[Mapping[str, Any]], first_col: bool) -> None:
    """One task's overall score against the step, one line per H_eff."""
    latest = reports[-1]
    metric = latest["tasks"][task]["metric"]
    for h in latest["h_eff"]:
        pts = [(r.get("step"), r["tasks"][task]["h_eff"][str(h)]["overall"].get(metric))
               for r in reports if task in r["tasks"] and str(h) in r["tasks"][task]["h_eff"]]
        pts = [(s, v) for s, v in pts if v is not None]
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=f"H_eff={h}")
    ax.set_xlabel("step")
    if first_col:
        ax.set_ylabel("accuracy, all levels")
    ax.set_title(f"{task}: {metric} vs step", fontsize=9)
    ax.set_ylim(-0.03, 1.03)
    ax.legend(fontsize=7)


def _no_tasks_figure() -> Figure:
    """The figure of reports without tasks: one line saying why it is empty."""
    fig = Figure(figsize=(6.0, 1.6))
    fig.text(0.5, 0.5, NO_TASKS_NOTE, ha="center", va="center", fontsize=11)
    return fig


def _metrics(info: Mapping[str, Any]) -> list[str]:
    """The task's own metric, then each sampled score with levels (pass@k, maj@k, …)."""
    sampled = {m: None for s in info["h_eff"].values()
               for m, e in (s.get("sampled") or {}).items() if e.get("levels")}
    return [info["metric"], *sampled]


def plot_bench(reports: list[Mapping[str, Any]], out_png: Path) -> Figure:
    """The summary figure: accuracy heatmap (difficulty × H_eff) per levelled task; a
    figure that says so (:data:`NO_TASKS_NOTE`) when the latest report has no task."""
    latest = reports[-1]
    if not latest["tasks"]:
        return save_figure(_no_tasks_figure(), out_png)
    tasks = [t for t, info in latest["tasks"].items() if info.get("metric") and
             any(s.get("levels") for s in info["h_eff"].values())]
    others = [t for t in latest["tasks"] if t not in tasks]
    maps = [(t, m) for t in tasks for m in _metrics(latest["tasks"][t])]
    panels = maps + ([("other tasks", "")] if others else [])
    with_trend = len(reports) > 1
    rows_max = max([len(_heatmap_grid(latest["tasks"][t], m)[0]) for t, m in maps] or [0])
    cols_max = max([len(latest["tasks"][t]["h_eff"]) for t in tasks] or [0])
    # Cells hold two lines (score, interval): size the panels by the largest grid.
    panel_w, panel_h = max(3.4, 0.62 * cols_max + 1.4), max(3.2, 0.42 * rows_max + 1.2)
    fig = Figure(layout="constrained", figsize=(panel_w * len(panels) + 1.0,
                                                panel_h * (2 if with_trend else 1) + 0.6))
    axes = fig.subplots(2 if with_trend else 1, len(panels), squeeze=False)
    train_max = latest.get("train_max_difficulty")
    image = None
    for col, (ax, (task, metric)) in enumerate(zip(axes[0], maps, strict=False)):
        image = _plot_heatmap(ax, task, metric, latest, col == 0)
    if others:
        _plot_other_tasks(axes[0][len(maps)], latest, others)
    if with_trend:
        for col, (ax, (task, metric)) in enumerate(zip(axes[1], panels, strict=False)):
            if task in tasks and metric == latest["tasks"][task]["metric"]:
                _plot_trend(ax, task, reports, col == 0)
            else:
                ax.axis("off")
    if image is not None:
        fig.colorbar(image, ax=list(axes[0][: len(maps)]), shrink=0.8, label="accuracy")
    caption = "accuracy by difficulty × H_eff [95% Wilson interval]; n per level on the axis"
    if train_max is not None:  # on its own line: one line would not fit a single panel
        caption += f"\ndashed line: top of the training range (level {train_max})"
    fig.suptitle(caption, fontsize=9)
    return save_figure(fig, out_png)
