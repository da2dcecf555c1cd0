"""Scores from lm-eval results: per task, per difficulty level, per H_eff; summary table and plot.

One benchmark JSON per snapshot (written by :func:`pipeline_lib.bench.runner.run_benchmarks`)::

    {"step": 300, "snapshot": "...", "h_eff": [1, 4, 8], "train_max_difficulty": 4,
     "tasks": {"loopline_khop": {"builtin": true, "output_type": "multiple_choice",
                                 "metric": "acc", "chance": 0.25,
                                 "h_eff": {"4": {"overall": {"acc": 0.61, "acc_stderr": 0.03},
                                                 "overall_ci": {"acc": {"n": 120, "ci_low": 0.52,
                                                                        "ci_high": 0.69}},
                                                 "levels": {"1": {"acc": 0.9, "n": 40,
                                                                  "ci_low": 0.77, "ci_high": 0.96},
                                                            ...},
                                                 "per_sample": {"0": 1.0, "1": 0.0, ...}}},
                                 "sample_levels": {"0": 1, "1": 1, ...},
                                 "paired_baseline": 1, "paired": [...],
                                 "adaptive": {"adaptive:0.01:8": {"overall": ..., "levels": ...,
                                                                  "per_sample": ...,
                                                                  "loops": {...}}}}}}

``adaptive`` (only with ``bench.adaptive.thresholds``) holds the same scores under each
adaptive exit, with ``loops``: the mean loops used and their histogram for the whole task and
per level (:func:`.loops_used.loops_summary`).

A generative task's settings also carry ``loops_per_answer`` (loops computed per generated
answer) and, when it samples several answers per question, ``sampled``: pass@k, maj@k and
lm-eval's other filters with intervals, levels and compute per answer (:mod:`.sampled`).

``per_sample`` keeps every example's score by lm-eval ``doc_id`` so that H_eff values are
compared on the same examples (``paired``: see :mod:`.intervals`); ``ci_low``/``ci_high`` are
95% intervals (Wilson for 0/1 scores).

:func:`summarize_bench` turns several of them into one long table
(:data:`SUMMARY_COLUMNS`; ``level`` is null for whole-task metrics; ``n``/``ci_*`` on the rows
of the per-sample metric; ``diff_vs_h1``/``diff_lo``/``diff_hi``/``p_mcnemar``: the paired
difference against the baseline H_eff; ``adaptive``/``mean_loops``/``loops_hist``: the
adaptive exit of the row, its mean loops used and histogram as JSON ``{"loops": tokens}``,
all null on fixed-H_eff rows, whose ``h_eff`` is the depth; an adaptive row's ``h_eff`` is
its MAX; ``computed_loops``: its mean loops computed (:mod:`.loops_used`); ``kv_bytes``/
``kv_bytes_core``: the task's largest KV cache in the row's setting, null where it generated
nothing; ``setting_seconds``: the setting's wall time, all tasks; ``samples``/
``loops_per_answer``: the answers a score rests on and its loops computed per answer,
:mod:`.sampled`) and the figure: an accuracy heatmap (difficulty ×
H_eff) per levelled task, each cell with its interval, where a depth effect shows as accuracy
rising from left to right (or does not).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..evaluate.heff_summary import write_parquet
from .heatmap import plot_bench
from .intervals import find_comparison, interval_fields, paired_comparisons

log = logging.getLogger(__name__)

SUMMARY_COLUMNS = ("step", "task", "h_eff", "level", "metric", "value", "n", "ci_low",
                   "ci_high", "diff_vs_h1", "diff_lo", "diff_hi", "p_mcnemar", "adaptive",
                   "mean_loops", "loops_hist", "computed_loops", "kv_bytes", "kv_bytes_core",
                   "setting_seconds", "samples", "loops_per_answer")
_SPENT = ("kv_bytes", "kv_bytes_core")
_SUMMARY_TYPES = {**dict.fromkeys(SUMMARY_COLUMNS, "float64"),
                  **dict.fromkeys(("step", "h_eff", "level", "n", *_SPENT, "samples"), "int64"),
                  **dict.fromkeys(("task", "metric", "adaptive", "loops_hist"), "string")}
_INTERVAL_KEYS = ("n", "ci_low", "ci_high")


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


def level_value(level: Any, level_field: str) -> int:
    """A document's level as an int (heatmap row); ``"3"`` is accepted, ``"hard"`` is not."""
    if isinstance(level, int) and not isinstance(level, bool):
        return level
    if isinstance(level, str) and level.strip().lstrip("-").isdigit():
        return int(level)
    if isinstance(level, float) and level.is_integer():
        return int(level)
    raise DataError(f"document field {level_field!r} = {level!r} is not an integer level; set "
                    "bench.level_field to an integer field (e.g. difficulty, hop count)")


def level_scores(samples: Iterable[Mapping[str, Any]], metric: str,
                 level_field: str = "level") -> dict[str, dict[str, float]]:
    """Mean per-sample ``metric`` grouped by the document's ``level_field``: {"3": {metric, n}}.

    Only one filter's samples count: ``none`` when present (the built-ins), else the first
    filter in the logs (a user task with its own ``filter_list``).
    """
    values: dict[int, list[float]] = defaultdict(list)
    for sample in scored_samples(samples):
        level = sample["doc"].get(level_field)
        if level is None:
            continue
        values[level_value(level, level_field)].append(float(sample[metric]))
    return {str(level): {metric: sum(v) / len(v), **interval_fields(v)}
            for level, v in sorted(values.items())}


def scored_samples(samples: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The samples of one filter: ``none`` when present (the built-ins), else the first
    filter in the logs (a user task with its own ``filter_list``)."""
    samples = list(samples)
    filters = [s.get("filter", "none") for s in samples]
    wanted = "none" if "none" in filters or not filters else filters[0]
    return [s for s, f in zip(samples, filters, strict=True) if f == wanted]


def per_sample_scores(samples: Iterable[Mapping[str, Any]], metric: str) -> dict[str, float]:
    """{doc_id: score} of every example (one filter, see :func:`scored_samples`)."""
    return {str(s["doc_id"]): float(s[metric]) for s in scored_samples(samples)}


def sample_levels(samples: Iterable[Mapping[str, Any]], level_field: str = "level") -> dict[str, int]:
    """{doc_id: level} of the examples whose document carries ``level_field``."""
    return {str(s["doc_id"]): level_value(s["doc"][level_field], level_field)
            for s in scored_samples(samples) if s["doc"].get(level_field) is not None}


def add_paired_comparisons(info: dict[str, Any]) -> None:
    """Set ``info["paired"]`` (and ``paired_baseline``) of one task from its ``per_sample``
    scores at every H_eff (see :func:`.intervals.paired_comparisons`)."""
    per_h = {int(h): s["per_sample"] for h, s in info["h_eff"].items() if "per_sample" in s}
    if len(per_h) < 2:
        return
    info["paired_baseline"] = min(per_h)
    info["paired"] = paired_comparisons(per_h, info.get("sample_levels") or None)


PREFERRED_METRICS = {"multiple_choice": "acc", "generate_until": "exact_match"}


def per_sample_metric(results: Mapping[str, Any], task: str) -> str | None:
    """The per-sample metric to break ``task`` down by level: ``acc`` (multiple_choice),
    ``exact_match`` (generate_until), else the task's first metric with a numeric value in
    every sample; None when the logs hold none."""
    samples = results.get("samples", {}).get(task) or []
    config = results.get("configs", {}).get(task, {})
    listed = [m.get("metric") for m in config.get("metric_list") or [] if isinstance(m, Mapping)]
    preferred = PREFERRED_METRICS.get(config.get("output_type", ""))
    for metric in [preferred, *listed]:
        if metric and samples and all(
                isinstance(s.get(metric), (int, float)) for s in samples):
            return metric
    return None


def chance_level(samples: Iterable[Mapping[str, Any]]) -> float | None:
    """Expected accuracy of uniform guessing on a multiple-choice task (None otherwise)."""
    inv = [1.0 / len(s["doc"]["choices"]) for s in samples if "choices" in s["doc"]]
    return sum(inv) / len(inv) if inv else None


def task_scores(results: Mapping[str, Any], task: str, metric: str | None,
                level_field: str = "level", sample_metric: str | None = None) -> dict[str, Any]:
    """Overall metrics and (when ``metric`` is given) per-level scores of one task at one H_eff;
    levels are read from each document's ``level_field``.

    The per-sample metric (``sample_metric``, default ``metric``) is also kept per example
    (``per_sample``) with the whole task's n and 95% interval (``overall_ci``).
    """
    entry: dict[str, Any] = {"overall": overall_metrics(results["results"][task])}
    sample_metric = sample_metric or metric
    if sample_metric is not None:
        samples = results.get("samples", {}).get(task)
        if samples is None:
            raise DataError(f"lm-eval returned no per-sample logs for task {task}; "
                            "run simple_evaluate with log_samples=True")
        if metric is not None:
            entry["levels"] = level_scores(samples, metric, level_field)
        entry["per_sample"] = per_sample_scores(samples, sample_metric)
        entry["overall_ci"] = {sample_metric: interval_fields(list(entry["per_sample"].values()))}
    return entry


# --------------------------------------------------------------------------- summary


def task_settings(info: Mapping[str, Any]) -> Iterator[tuple[int, str | None, Mapping[str, Any]]]:
    """(h_eff, adaptive label or None, scores) of every depth setting of one task: each
    fixed H_eff, then each adaptive exit (its h_eff: the most loops a token may use)."""
    for h_eff, scores in info["h_eff"].items():
        yield int(h_eff), None, scores
    for label, scores in (info.get("adaptive") or {}).items():
        yield int(scores["loops"]["max_loops"]), label, scores


def _loops_cells(label: str | None, loops: Mapping[str, Any] | None) -> dict[str, Any]:
    """``adaptive``/``mean_loops``/``loops_hist``/``computed_loops`` of a row: null for a
    fixed H_eff (and ``computed_loops`` for a bench JSON from before it was recorded)."""
    if label is None or loops is None:
        return {"adaptive": label, "mean_loops": None, "loops_hist": None,
                "computed_loops": None}
    return {"adaptive": label, "mean_loops": loops["mean"],
            "loops_hist": json.dumps(loops["hist"]), "computed_loops": loops.get("computed_mean")}


def _spent_cells(report: Mapping[str, Any], h: int, label: str | None,
                 scores: Mapping[str, Any]) -> dict[str, Any]:
    """``kv_bytes``/``kv_bytes_core`` (the task's largest cache in this setting, null when
    it generated nothing) and ``setting_seconds`` (the setting, all tasks) of a row."""
    seconds = (report.get("setting_seconds") or {}).get(str(h) if label is None else label)
    return {**{k: scores.get(k) for k in _SPENT}, "setting_seconds": seconds}


def _answer_cells(info: Mapping[str, Any], scores: Mapping[str, Any], metric: str
                  ) -> dict[str, Any]:
    """``samples``/``loops_per_answer`` of a row: the sampled answers its score rests on and
    the loops they computed (:mod:`.sampled`); one answer for the task's own metric; null
    where nothing was generated or the metric counts no answers."""
    sampled = (scores.get("sampled") or {}).get(metric)
    if sampled is not None and "loops_per_answer" in sampled:
        return {"samples": sampled["samples"], "loops_per_answer": sampled["loops_per_answer"]}
    if metric == info.get("metric") and scores.get("loops_per_answer") is not None:
        return {"samples": 1, "loops_per_answer": scores["loops_per_answer"]}
    return {"samples": None, "loops_per_answer": None}


def _level_cells(scores: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(level, {metric: value, n, ci_…}) of the task's own metric, then of every sampled
    score (:mod:`.sampled`)."""
    yield from scores.get("levels", {}).items()
    for sampled in (scores.get("sampled") or {}).values():
        yield from sampled.get("levels", {}).items()


def bench_records(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One benchmark JSON as long-table rows (see :data:`SUMMARY_COLUMNS`)."""
    rows: list[dict[str, Any]] = []
    step = report.get("step")
    for task, info in report["tasks"].items():
        for h, label, scores in task_settings(info):
            cis_sampled = scores.get("sampled") or {}  # no paired comparison (yet)
            cis = {**cis_sampled, **scores.get("overall_ci", {})}
            loops = scores.get("loops")
            spent = _spent_cells(report, h, label, scores)
            for metric, value in scores["overall"].items():
                rows.append({"step": step, "task": task, **_summary_cells(
                    info, h, None, metric, value, cis.get(metric),
                    label is None and metric not in cis_sampled),
                    **_loops_cells(label, loops), **spent,
                    **_answer_cells(info, scores, metric)})
            for level, per_level in _level_cells(scores):
                level_loops = (loops or {}).get("levels", {}).get(level)
                for metric, value in per_level.items():
                    if metric not in _INTERVAL_KEYS:
                        rows.append({"step": step, "task": task, **_summary_cells(
                            info, h, int(level), metric, value, per_level,
                            label is None and metric not in cis_sampled),
                            **_loops_cells(label, level_loops), **spent,
                            **_answer_cells(info, scores, metric)})
    return rows


def _mlflow_name(metric: str) -> str:
    """A metric label as MLflow takes it: ``maj@5`` → ``maj_at_5`` (no ``@`` in names)."""
    return metric.replace("@", "_at_")


def bench_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """MLflow metrics of one benchmark JSON (the bench stage's child run): every row of
    :func:`bench_records` as ``bench/{task}/{metric}_h{h}`` (fixed H_eff) or
    ``bench/{task}/{metric}_{adaptive}`` (adaptive exit), ``_k{level}`` appended per level;
    per adaptive exit also ``bench/{task}/mean_loops_{adaptive}`` and
    ``bench/{task}/computed_loops_{adaptive}`` (and per level) and the whole task's histogram
    ``bench/{task}/loops_hist_{adaptive}/{loops}`` (tokens); per setting the task's
    ``bench/{task}/kv_bytes[_core]{depth}`` where it generated, and ``bench/seconds{depth}``."""
    metrics: dict[str, float] = {}
    for row in bench_records(report):
        level = "" if row["level"] is None else f"_k{row['level']}"
        depth = f"_h{row['h_eff']}" if row["adaptive"] is None else f"_{row['adaptive']}"
        metrics[f"bench/{row['task']}/{_mlflow_name(row['metric'])}{depth}{level}"] = row["value"]
        for key in ("mean_loops", "computed_loops"):
            if row[key] is not None:
                metrics[f"bench/{row['task']}/{key}{depth}{level}"] = row[key]
        if row["level"] is None:
            for key in _SPENT:
                if row[key] is not None:
                    metrics[f"bench/{row['task']}/{key}{depth}"] = float(row[key])
            if row["setting_seconds"] is not None:
                metrics[f"bench/seconds{depth}"] = row["setting_seconds"]
    for task, info in report["tasks"].items():
        for label, scores in (info.get("adaptive") or {}).items():
            for loops, tokens in scores["loops"]["hist"].items():
                metrics[f"bench/{task}/loops_hist_{label}/{loops}"] = float(tokens)
    return metrics


def _summary_cells(info: Mapping[str, Any], h: int, level: int | None, metric: str, value: float,
                   interval: Mapping[str, Any] | None, paired: bool = True) -> dict[str, Any]:
    """One table row past (step, task): the score, its interval and (for the per-sample
    metric of a fixed H_eff, ``paired``) the paired difference against the baseline H_eff."""
    base = info.get("paired_baseline")
    diff = None
    if paired and interval is not None and base is not None and h != base:
        diff = find_comparison(info.get("paired", []), h, base, level)
    diff = diff or {}
    return {"h_eff": h, "level": level, "metric": metric, "value": float(value),
            **{k: (interval or {}).get(k) for k in _INTERVAL_KEYS},
            "diff_vs_h1": diff.get("diff"), "diff_lo": diff.get("lo"),
            "diff_hi": diff.get("hi"), "p_mcnemar": diff.get("p_mcnemar")}


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
    row of panels shows whole-task accuracy against step, one line per H_eff. Reports
    without tasks (no benchmarks configured) give no rows and a figure that says so.
    """
    if not jsons:
        raise DataError("summarize-bench got no benchmark JSON files; pass at least one")
    reports = sorted((_read_report(Path(p)) for p in jsons), key=lambda r: r.get("step") or 0)
    rows = [row for report in reports for row in bench_records(report)]
    write_parquet(rows, SUMMARY_COLUMNS, _SUMMARY_TYPES, Path(out_parquet))
    plot_bench(reports, Path(out_png))
    log.info("bench summary: %d rows from %d reports → %s, %s", len(rows), len(reports),
             out_parquet, out_png)
    return rows
