"""Plots of the comparison: loss and accuracy against H_eff with intervals, training loss;
per variant, the validation loss during training at every H_eff."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..figures import pyplot, save_figure
from .answers import COMPUTE_PLOT, plot_accuracy_vs_compute, samples_more_than_once
from .labels import top_trained_level
from .markdown import depth_settings
from .runs import RunResults, Score

LOOPS_PLOT = "accuracy_vs_loops.png"


def plot_comparison(runs: Sequence[RunResults], out_dir: Path) -> list[Path]:
    """``loss_vs_heff.png``, ``accuracy_vs_heff.png``, ``train_loss.png`` and, when some
    variant was benchmarked under adaptive exit, ``accuracy_vs_loops.png``: accuracy vs
    compute spent, and when some variant sampled several answers per question,
    ``accuracy_vs_compute.png``: accuracy vs compute per answer, into a fresh ``out_dir``
    (:func:`pipeline_lib.compare.compare_runs` removes a stale one of either)."""
    plt = pyplot()
    plots = [("loss_vs_heff.png", _plot_loss_vs_heff), ("accuracy_vs_heff.png", _plot_accuracy),
             ("train_loss.png", _plot_train_loss)]
    if any(r.adaptive for r in runs):
        plots.append((LOOPS_PLOT, _plot_accuracy_vs_loops))
    if any(samples_more_than_once(r.answers) for r in runs):
        plots.append((COMPUTE_PLOT, plot_accuracy_vs_compute))
    for name, plot in plots:
        save_figure(plot(plt, runs), out_dir / name)
    return [out_dir / name for name, _ in plots]


def plot_val_loss_curves(curves: Mapping[int, Sequence[tuple[int, float]]], run: str,
                         path: Path) -> Path:
    """``path``: validation loss against the training step, one line per H_eff (``curves``:
    :func:`.runs.val_loss_curves` of the run ``run``)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for h, points in sorted(curves.items()):
        steps, losses = zip(*points, strict=True)
        ax.plot(steps, losses, marker="." if len(points) < 30 else None, linewidth=1,
                label=f"H_eff={h}")
    ax.set(xlabel="optimizer step", ylabel="validation loss (nats/token)",
           title=f"{run}: validation loss while training, by test-time loops")
    ax.legend(fontsize="small")
    save_figure(fig, path)
    return path


def labels_plot_levels(check: Mapping[str, Any]) -> list[int]:
    """The levels that matter for the depth question: the top level of the training range
    and every level beyond it."""
    levels = sorted({r["level"] for r in check["table"] if r["level"] is not None})
    top = top_trained_level(check)
    return [lv for lv in levels if lv == top or lv > check["train_max_level"]]


def plot_labels_accuracy(check: Mapping[str, Any], path: Path) -> Path:
    """``path``: token accuracy vs H_eff (log 2), one panel per level of
    :func:`labels_plot_levels`, one line per variant with its 95% band, a dotted vertical line
    at each looped variant's train_max_loops (``check``: :func:`.labels.labels_depth_check`)."""
    plt = pyplot()
    levels = labels_plot_levels(check)
    fig, axes = plt.subplots(1, len(levels), figsize=(4 * len(levels), 3.6), sharey=True,
                             constrained_layout=True, squeeze=False)
    loops = sorted({check["train"][r]["max_loops"] for r, k in check["kinds"].items()
                    if k == "looped"})
    for ax, level in zip(axes[0], levels, strict=True):
        for i, run in enumerate(check["runs"]):
            rows = sorted((r for r in check["table"] if r["variant"] == run
                           and r["level"] == level), key=lambda r: r["h_eff"])
            if not rows:
                continue
            hs = [r["h_eff"] for r in rows]
            ax.plot(hs, [r["accuracy"] for r in rows], "o-", color=f"C{i}", markersize=3,
                    label=f"{run} ({check['kinds'][run] or 'unknown'})")
            if all(r["ci_low"] is not None for r in rows):
                ax.fill_between(hs, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows],
                                color=f"C{i}", alpha=0.2, linewidth=0)
        for t in loops:
            ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        where = " (beyond training)" if level > check["train_max_level"] else " (top trained)"
        hs = sorted({r["h_eff"] for r in check["table"] if r["level"] == level})
        ax.set_xscale("log", base=2)
        ax.set_xticks(hs, [str(h) for h in hs])
        ax.minorticks_off()
        ax.set(xlabel="H_eff", title=f"level {level}{where}")
    axes[0][0].set_ylabel("token accuracy (95% band)")
    axes[0][0].legend(fontsize="small")
    fig.suptitle("labelled task: accuracy vs test-time loops (dotted: train_max_loops)",
                 fontsize="medium")
    save_figure(fig, path)
    return path


def _plot_loss_vs_heff(plt: Any, runs: Sequence[RunResults]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for r in runs:
        hs = sorted(r.val_loss)
        err = [1.96 * (r.loss_scores[h].stderr or 0.0) if h in r.loss_scores else 0.0 for h in hs]
        ax.errorbar(hs, [r.val_loss[h] for h in hs], yerr=err, marker="o", capsize=3,
                    label=r.name)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="test-time loops H_eff", ylabel="validation loss (nats/token)",
           title="final snapshot: loss vs H_eff (bars: ±1.96 SE)")
    ax.legend()
    return fig


def _plot_accuracy(plt: Any, runs: Sequence[RunResults]) -> Any:
    tasks = sorted({k for r in runs for k in r.accuracy})
    fig, axes = plt.subplots(1, max(len(tasks), 1), figsize=(4 * max(len(tasks), 1), 3.6),
                             constrained_layout=True, squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=False):
        for r in runs:
            per_h = r.accuracy.get(task, {})
            hs = sorted(per_h)
            cells = r.scores.get(task, {}).get(None, {})
            lo = [per_h[h] - (cells[h].ci_low if h in cells and cells[h].ci_low is not None
                              else per_h[h]) for h in hs]
            hi = [(cells[h].ci_high if h in cells and cells[h].ci_high is not None
                   else per_h[h]) - per_h[h] for h in hs]
            ax.errorbar(hs, [per_h[h] for h in hs], yerr=[lo, hi], marker="o", capsize=3,
                        label=r.name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("H_eff")
        ax.set_title(f"{task} (95% intervals)", fontsize="small")
        ax.legend(fontsize="small")
    axes[0][0].set_ylabel("accuracy")
    return fig


def _interval_bars(scores: Sequence[Score]) -> list[list[float]]:
    """Error bars [below, above] of each score's 95% interval (none where it has none)."""
    lo = [s.value - (s.ci_low if s.ci_low is not None else s.value) for s in scores]
    hi = [(s.ci_high if s.ci_high is not None else s.value) - s.value for s in scores]
    return [lo, hi]


def _plot_accuracy_vs_loops(plt: Any, runs: Sequence[RunResults]) -> Any:
    """Accuracy against compute spent (mean loops computed per token), one panel per task
    with adaptive results: per variant the fixed H_eff settings as a line (circles) and each
    adaptive exit as a point (filled square); where a setting's tokens computed more loops
    than they used (scored tokens: the pass runs every loop), a hollow square at the loops
    used, joined to it by a dotted line. Bars: 95% intervals."""
    keys = sorted({k for r in runs for k in r.adaptive})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.8 * len(keys), 4.0),
                             constrained_layout=True, squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        for i, r in enumerate(runs):
            points = depth_settings(r, key)
            for adaptive, style in ((False, "o-"), (True, "s")):
                pts = [p for p in points if p.adaptive == adaptive]
                if pts:
                    ax.errorbar([p.computed for p in pts], [p.score.value for p in pts],
                                yerr=_interval_bars([p.score for p in pts]), fmt=style,
                                color=f"C{i}", capsize=3,
                                label=f"{r.name} ({'adaptive' if adaptive else 'fixed H_eff'})")
            saved = [p for p in points if p.adaptive and p.used < p.computed]
            for n, p in enumerate(saved):
                ax.plot([p.used, p.computed], [p.score.value] * 2, ":", color=f"C{i}",
                        linewidth=1)
                ax.plot([p.used], [p.score.value], "s", mfc="none", color=f"C{i}",
                        label=f"{r.name} (adaptive: loops used, not saved)" if n == 0 else None)
        ax.set(xlabel="mean loops computed per token", title=f"{key} (95% intervals)")
        ax.legend(fontsize="x-small")
    axes[0][0].set_ylabel("accuracy, all levels")
    fig.suptitle("accuracy vs compute spent", fontsize="medium")
    return fig


def _plot_train_loss(plt: Any, runs: Sequence[RunResults]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    for r in runs:
        if r.train_curve:
            steps, losses = zip(*r.train_curve, strict=True)
            ax.plot(steps, losses, label=r.name, linewidth=1)
    ax.set(xlabel="optimizer step", ylabel="training loss", title="training loss")
    ax.legend()
    return fig
