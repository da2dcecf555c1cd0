"""Scores from lm-eval results: per task, per difficulty level, per H_eff; summary table and plot.

One benchmark JSON per snapshot (written by :func:`pipeline_lib.bench.runner.run_benchmarks`)::

    {"step": 300, "snapshot": "...", "h_eff": [1, 4, 8], "train_max_difficulty": 4,
     "tasks": {"loopline_khop": {"builtin": true, "output_type": "multiple_choice",
                                 "metric": "acc", "chance": 0.25,
                                 "h_eff": {"4": {"overall": {"acc": 0.61, "acc_stderr": 0.03},
                                                 "levels": {"1": {"acc": 0.9, "n": 40}, ...}}}}}}

:func:`summarize_bench` turns several of them into one long table
(step, task, h_eff, level, metric, value; ``level`` is null for whole-task metrics) and the
figure: an accuracy heatmap (difficulty × H_eff) per built-in task, where a depth effect
shows as accuracy rising from left to right (or does not).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import DataError

log = logging.getLogger(__name__)

SUMMARY_COLUMNS = ("step", "task", "h_eff", "level", "metric", "value")


def _metric_name(key: str) -> str:
    """lm-eval's ``"acc,none"`` → ``"acc"``; a real filter stays visible: ``"em/strict"``."""
    metric, _, filt = key.partition(",")
    return metric if filt in ("", "none") else f"{metric}/{filt}"


def overall_metrics(task_results: Mapping[str, Any]) -> dict[str, float]:
    """The numeric whole-task metrics of one entry of lm-eval's ``results["results"]``."""
    out: dict[str, float] = {}
    for key, value in task_results.items():
        if key in ("alias", "name", "sample_len") or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)) and math.isfinite(float(value)):
            out[_metric_name(key)] = float(value)
    return out


def level_scores(samples: Iterable[Mapping[str, Any]], metric: str) -> dict[str, dict[str, float]]:
    """Mean per-sample ``metric`` grouped by the document's ``level`` field: {"3": {metric, n}}."""
    values: dict[int, list[float]] = defaultdict(list)
    for sample in samples:
        level = sample["doc"].get("level")
        if level is None or sample.get("filter", "none") != "none":
            continue
        values[int(level)].append(float(sample[metric]))
    return {str(level): {metric: sum(v) / len(v), "n": len(v)} for level, v in sorted(values.items())}


def chance_level(samples: Iterable[Mapping[str, Any]]) -> float | None:
    """Expected accuracy of uniform guessing on a multiple-choice task (None otherwise)."""
    inv = [1.0 / len(s["doc"]["choices"]) for s in samples if "choices" in s["doc"]]
    return sum(inv) / len(inv) if inv else None


def task_scores(results: Mapping[str, Any], task: str, metric: str | None) -> dict[str, Any]:
    """Overall metrics and (when ``metric`` is given) per-level scores of one task at one H_eff."""
    entry: dict[str, Any] = {"overall": overall_metrics(results["results"][task])}
    if metric is not None:
        samples = results.get("samples", {}).get(task)
        if samples is None:
            raise DataError(f"lm-eval returned no per-sample logs for task {task}; "
                            "run simple_evaluate with log_samples=True")
        entry["levels"] = level_scores(samples, metric)
    return entry


# --------------------------------------------------------------------------- summary


def bench_records(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One benchmark JSON as long-table rows (see :data:`SUMMARY_COLUMNS`)."""
    rows: list[dict[str, Any]] = []
    step = report.get("step")
    for task, info in report["tasks"].items():
        for h_eff, scores in info["h_eff"].items():
            for metric, value in scores["overall"].items():
                rows.append({"step": step, "task": task, "h_eff": int(h_eff), "level": None,
                             "metric": metric, "value": float(value)})
            for level, per_level in scores.get("levels", {}).items():
                for metric, value in per_level.items():
                    if metric == "n":
                        continue
                    rows.append({"step": step, "task": task, "h_eff": int(h_eff),
                                 "level": int(level), "metric": metric, "value": float(value)})
    return rows


def _read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"benchmark result {path} does not exist; run the bench stage first") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"benchmark result {path} is not valid JSON ({exc}); rerun the bench "
                        "stage for it") from None
    if not isinstance(report, dict) or "tasks" not in report:
        raise DataError(f"benchmark result {path} has no 'tasks' key; rerun the bench stage")
    return report


def summarize_bench(jsons: list[Path], out_parquet: Path, out_png: Path) -> list[dict[str, Any]]:
    """Long table of every benchmark JSON → parquet, and the heatmap figure → PNG.

    Returns the table rows. The heatmaps show the latest step; with several steps a second
    row of panels shows whole-task accuracy against step, one line per H_eff.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not jsons:
        raise DataError("summarize-bench got no benchmark JSON files; pass at least one")
    reports = sorted((_read_report(Path(p)) for p in jsons), key=lambda r: r.get("step") or 0)
    rows = [row for report in reports for row in bench_records(report)]
    table = pa.table({
        "step": pa.array([r["step"] for r in rows], pa.int64()),
        "task": pa.array([r["task"] for r in rows], pa.string()),
        "h_eff": pa.array([r["h_eff"] for r in rows], pa.int64()),
        "level": pa.array([r["level"] for r in rows], pa.int64()),
        "metric": pa.array([r["metric"] for r in rows], pa.string()),
        "value": pa.array([r["value"] for r in rows], pa.float64()),
    })
    Path(out_parquet).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out_parquet)
    plot_bench(reports, Path(out_png))
    log.info("bench summary: %d rows from %d reports → %s, %s", len(rows), len(reports),
             out_parquet, out_png)
    return rows


def _heatmap_grid(info: Mapping[str, Any]) -> tuple[list[int], list[int], list[list[float]]]:
    """(levels, h_effs, acc[level][h_eff]) of one task; NaN where a cell is missing."""
    metric = info["metric"]
    h_effs = sorted(int(h) for h in info["h_eff"])
    levels = sorted({int(lv) for s in info["h_eff"].values() for lv in s.get("levels", {})})
    grid = [[info["h_eff"][str(h)].get("levels", {}).get(str(lv), {}).get(metric, math.nan)
             for h in h_effs] for lv in levels]
    return levels, h_effs, grid


def plot_bench(reports: list[Mapping[str, Any]], out_png: Path) -> None:
    """The summary figure: accuracy heatmap (difficulty × H_eff) per levelled task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    latest = reports[-1]
    tasks = [t for t, info in latest["tasks"].items() if info.get("metric") and
             any(s.get("levels") for s in info["h_eff"].values())]
    others = [t for t in latest["tasks"] if t not in tasks]
    panels = tasks + (["other tasks"] if others else [])
    if not panels:
        raise DataError("benchmark results hold no task scores to plot; check bench.tasks")
    with_trend = len(reports) > 1
    fig, axes = plt.subplots(2 if with_trend else 1, len(panels), squeeze=False,
                             layout="constrained",
                             figsize=(3.4 * len(panels) + 1.0, 3.2 * (2 if with_trend else 1) + 0.6))
    train_max = latest.get("train_max_difficulty")
    image = None
    for col, (ax, task) in enumerate(zip(axes[0], tasks, strict=False)):
        info = latest["tasks"][task]
        levels, h_effs, grid = _heatmap_grid(info)
        data = np.array(grid, dtype=float)
        image = ax.imshow(data, vmin=0.0, vmax=1.0, cmap="viridis", origin="lower", aspect="auto")
        for i in range(len(levels)):
            for j in range(len(h_effs)):
                if np.isfinite(data[i, j]):
                    ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="black" if data[i, j] > 0.6 else "white")
        ax.set_xticks(range(len(h_effs)), [str(h) for h in h_effs])
        ax.set_yticks(range(len(levels)), [str(lv) for lv in levels])
        ax.set_xlabel("H_eff (test-time loops)")
        if col == 0:
            ax.set_ylabel("difficulty level")
        if train_max is not None and levels and levels[0] <= train_max < levels[-1]:
            edge = levels.index(train_max) + 0.5
            ax.axhline(edge, color="white", linestyle="--", linewidth=1.2)
        chance = info.get("chance")
        suffix = f", chance {chance:.2f}" if chance is not None else ""
        ax.set_title(f"{task}\n{info['metric']} at step {latest.get('step')}{suffix}", fontsize=9)
    if others:
        ax = axes[0][len(tasks)]
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
    if with_trend:
        for col, (ax, task) in enumerate(zip(axes[1], panels, strict=False)):
            if task not in tasks:
                ax.axis("off")
                continue
            metric = latest["tasks"][task]["metric"]
            for h in latest["h_eff"]:
                pts = [(r.get("step"), r["tasks"][task]["h_eff"][str(h)]["overall"].get(metric))
                       for r in reports if task in r["tasks"] and str(h) in r["tasks"][task]["h_eff"]]
                pts = [(s, v) for s, v in pts if v is not None]
                ax.plot([s for s, _ in pts], [v for _, v in pts], marker="o", label=f"H_eff={h}")
            ax.set_xlabel("step")
            if col == 0:
                ax.set_ylabel("accuracy, all levels")
            ax.set_title(f"{task}: {metric} vs step", fontsize=9)
            ax.set_ylim(-0.03, 1.03)
            ax.legend(fontsize=7)
    if image is not None:
        fig.colorbar(image, ax=list(axes[0][: len(tasks)]), shrink=0.8, label="accuracy")
    caption = "accuracy by difficulty × H_eff"
    if train_max is not None:
        caption += f"; dashed line: top of the training range (level {train_max})"
    fig.suptitle(caption, fontsize=10)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
