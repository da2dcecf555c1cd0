"""Downstream benchmarks of one snapshot (child run ``bench/step_…``; the final snapshot's
scores also go to the parent run, :mod:`..final_results`) and their summary over the
benchmarked snapshots (``bench_summary``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...bench import run_benchmarks, summarize_bench
from ...bench.scoring import bench_metrics
from ...bench.tasks import check_tasks_dir
from ...checkpoint.manifest import verify_snapshot
from ...model.kernels import kernel_tags
from ...output_paths import BENCH_JSON, FIGURE, TABLE
from ...output_set import output_set
from ...spec.config import Config
from ...spec.layout import RunLayout
from ...tracking import start_stage
from ..final_results import bench_values, is_final
from .common import check_stage_outputs, step_name


def bench_stage(cfg: Config, run_dir: Path, snapshot: Path, out: Path,
                tasks_dir: Path) -> dict[str, Any]:
    """Downstream benchmarks of one snapshot at every ``bench.h_eff`` (and adaptive exit),
    as child run ``bench/step_…`` with metrics ``bench/{task}/{metric}_h{h}`` (adaptive:
    ``…_adaptive:T:MAX`` with ``mean_loops_…``, ``computed_loops_…`` and
    ``loops_hist_…/{loops}``; per setting ``kv_bytes[_core]…`` and ``bench/seconds…``, see
    :func:`pipeline_lib.bench.scoring.bench_metrics`) at the snapshot's step; the final
    snapshot's fixed-H_eff scores also go to the parent run (``bench/{task}/{metric}`` at
    step = H_eff, with their intervals). With no benchmarks configured the report has no
    task and the child run no metric."""
    check_stage_outputs(cfg, run_dir, [(out, BENCH_JSON)], [("--snapshot", snapshot)])
    check_tasks_dir(Path(tasks_dir))
    verify_snapshot(Path(snapshot), hash_files=())  # before the task files are written
    with output_set() as outputs:
        result = run_benchmarks(Path(snapshot), cfg.bench, Path(tasks_dir), outputs.file(out),
                                device=cfg.experiment.device,
                                precision=cfg.experiment.precision)
    step = result.get("step")
    with start_stage(cfg, run_dir, f"bench/{step_name(step)}",
                     params={"bench.tasks": cfg.bench.tasks, "bench.h_eff": cfg.bench.h_eff,
                             **_adaptive_params(cfg.bench)},
                     tags=kernel_tags()) as stage:
        stage.log_metrics(step or 0, bench_metrics(result))
        stage.log_artifact(out, "bench")
        if is_final(Path(snapshot)):
            stage.log_headline("bench", bench_values(result), {"step": step})
    return result


def _adaptive_params(bench: Any) -> dict[str, Any]:
    """The bench stage's adaptive-exit params; none when it is off."""
    adaptive = bench.adaptive
    if not adaptive.thresholds:
        return {}
    return {"bench.adaptive.criteria": adaptive.criteria,
            "bench.adaptive.thresholds": adaptive.thresholds,
            "bench.adaptive.criterion_thresholds": adaptive.criterion_thresholds,
            "bench.adaptive.max_loops": adaptive.max_loops}


def summarize_bench_stage(cfg: Config, run: str, run_dir: Path, inputs: Sequence[Path],
                          table: Path, plot: Path) -> dict[Path, int]:
    """Long table + accuracy heatmaps over the benchmarked snapshots (``bench_summary``).
    Returns the rows written per table."""
    check_stage_outputs(cfg, run_dir, [(table, TABLE), (plot, FIGURE)],
                        [("--inputs", path) for path in inputs])
    with output_set() as outputs:  # the table and the figure appear together or not at all
        rows = {Path(table): len(summarize_bench([Path(p) for p in inputs],
                                                 outputs.file(table), outputs.file(plot)))}
    with start_stage(cfg, run_dir, "bench_summary") as stage:
        stage.log_artifact(table, "bench")
        stage.log_artifact(plot, "bench")
        for tsv in RunLayout.at(run_dir).benchmarks("bench_downstream"):
            stage.log_artifact(tsv, "benchmarks")
    return rows
