"""A config without downstream benchmarks (``bench.tasks: []``, no ``bench.include_path``):
the bench job writes a report without tasks from the snapshot's config and trainer state
alone, the summary an empty table and a figure that says so, and the stage tracks it."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from snapshot_helpers import tiny_model_config, write_tiny_snapshot

from pipeline_lib.bench import run_benchmarks, summarize_bench
from pipeline_lib.bench.heatmap import NO_TASKS_NOTE, plot_bench
from pipeline_lib.bench.scoring import SUMMARY_COLUMNS, bench_metrics
from pipeline_lib.checkpoint.compat import snapshot_config
from pipeline_lib.errors import CheckpointError
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.spec.config import BenchConfig, TrackingConfig
from pipeline_lib.workflow.final_results import bench_values
from pipeline_lib.workflow.stages.bench import bench_stage, summarize_bench_stage

NO_BENCH = BenchConfig(tasks=[], h_eff=[1, 3])


@pytest.fixture(scope="module")
def weightless_snapshot(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """The final snapshot (step 7 of 7) of a tiny model whose weights file is then zeroed
    (size kept, so the manifest's cheap checks pass): whatever loads the model fails."""
    from pipeline_lib.model.looped import LoopedLM

    run = tmp_path_factory.mktemp("run")
    snapshot = write_tiny_snapshot(run / "snapshots" / "step_0000007",
                                   LoopedLM(tiny_model_config()), tokenizer, step=7,
                                   total_steps=7)
    weights = snapshot / "model.safetensors"
    weights.write_bytes(bytes(weights.stat().st_size))
    return snapshot


def test_the_model_of_the_weightless_snapshot_cannot_load(weightless_snapshot: Path):
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_for_eval(weightless_snapshot)


def test_no_tasks_report_from_config_and_trainer_state(weightless_snapshot: Path,
                                                      tmp_path: Path, caplog):
    out = tmp_path / "bench" / "step_0000007.json"
    with caplog.at_level(logging.INFO, logger="pipeline_lib.bench.runner"):
        report = run_benchmarks(weightless_snapshot, NO_BENCH, tmp_path / "tasks", out)
    assert json.loads(out.read_text()) == report
    assert report["tasks"] == {} and report["setting_seconds"] == {}
    assert (report["step"], report["h_eff"]) == (7, [1, 3])
    assert (report["train_loops"], report["train_max_difficulty"]) == (2, 2)
    assert report["snapshot"] == str(weightless_snapshot.resolve())
    assert report["bench"]["examples_per_level"] == NO_BENCH.examples_per_level
    assert report["bench"]["include_path"] == "" and "adaptive" not in report
    assert (tmp_path / "tasks").is_dir() and not any((tmp_path / "tasks").iterdir())
    assert [r.getMessage() for r in caplog.records if "no downstream" in r.getMessage()] == [
        "bench: no downstream benchmarks configured (bench.tasks is empty and "
        "bench.include_path is not set); writing a report without tasks"]


@pytest.mark.slow  # a fresh interpreter imports torch and lm-eval (~10 s on 2 cores)
def test_no_tasks_report_leaves_lm_eval_evaluator_unimported(weightless_snapshot: Path,
                                                              tmp_path: Path):
    """In a fresh interpreter (this one may have imported it for other tests)."""
    code = ("import sys; from pathlib import Path; from pipeline_lib.bench import run_benchmarks; "
            "from pipeline_lib.spec.config import BenchConfig; "
            f"r = run_benchmarks(Path({str(weightless_snapshot)!r}), BenchConfig(tasks=[]), "
            f"Path({str(tmp_path / 'tasks')!r}), None); "
            "print(r['step'], r['tasks'], 'lm_eval.evaluator' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "7 {} False"


def test_summary_of_reports_without_tasks(weightless_snapshot: Path, tmp_path: Path):
    report = run_benchmarks(weightless_snapshot, NO_BENCH, tmp_path / "tasks",
                            tmp_path / "b.json")
    rows = summarize_bench([tmp_path / "b.json"], tmp_path / "s.parquet", tmp_path / "s.png")
    table = pq.read_table(tmp_path / "s.parquet")
    assert rows == [] and table.num_rows == 0 and tuple(table.column_names) == SUMMARY_COLUMNS
    assert (tmp_path / "s.png").read_bytes()[:4] == b"\x89PNG"
    figure = plot_bench([report], tmp_path / "again.png")
    assert [t.get_text() for t in figure.texts] == [NO_TASKS_NOTE]
    assert NO_TASKS_NOTE == "no downstream benchmarks configured (bench.tasks is empty)"
    assert bench_metrics(report) == {} and bench_values(report) == {}


@pytest.mark.slow  # a fresh MLflow store is migrated (~15 s on 2 cores)
def test_bench_stages_track_a_report_without_tasks(weightless_snapshot: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # it would replace the store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = dataclasses.replace(snapshot_config(weightless_snapshot), bench=NO_BENCH,
                              tracking=TrackingConfig(uri=uri))
    run_dir = tmp_path / "results" / "solo"
    out = run_dir / "bench" / "step_0000007.json"
    report = bench_stage(cfg, run_dir, weightless_snapshot, out, run_dir / "bench" / "tasks")
    assert report["tasks"] == {} and json.loads(out.read_text()) == report
    rows = summarize_bench_stage(cfg, "solo", run_dir, [out], run_dir / "bench" / "s.parquet",
                                 run_dir / "bench" / "s.png")
    assert rows == {run_dir / "bench" / "s.parquet": 0}
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(cfg.experiment.name)
                               .experiment_id])
    stages = {r.data.tags.get("loopline.stage"): r for r in runs}
    assert stages["bench/step_0000007"].data.metrics == {}
    assert stages["bench/step_0000007"].data.params["bench.tasks"] == "[]"
    artifacts = {a.path for a in client.list_artifacts(stages["bench_summary"].info.run_id,
                                                       "bench")}
    assert artifacts == {"bench/s.parquet", "bench/s.png"}
