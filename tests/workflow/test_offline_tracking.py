"""With an unreachable tracking server the pipeline still finishes; sync-tracking then
delivers every metric exactly once into a reachable store (and a second sync adds nothing)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.workflow_runs import snakemake

pytestmark = pytest.mark.slow


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_pipeline_survives_a_dead_store_and_sync_delivers_once(tmp_path: Path):
    override = tmp_path / "offline.yaml"
    override.write_text(
        f"tracking: {{uri: 'http://127.0.0.1:{_closed_port()}'}}\n"
        "train: {total_steps: 10, steps_per_segment: 5}\n"
        "bench: {tasks: [loopline_parity], h_eff: [1], examples_per_level: 2}\n"
        "runs: {solo: {model: {loops: 2}}}\n")
    work = tmp_path / "work"
    work.mkdir()
    result = snakemake(work, "--cores", "2", extra_configs=(override,))
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = work / "results" / "solo"
    assert (run_dir / "tracking_outbox.jsonl").stat().st_size > 0

    store = f"sqlite:///{tmp_path / 'synced.db'}"
    sync = [sys.executable, "-m", "pipeline_lib", "sync-tracking", "--run-dir", str(run_dir),
            "--uri", store]
    first = subprocess.run(sync, capture_output=True, text=True, cwd=work)
    assert first.returncode == 0, first.stderr[-3000:]
    second = subprocess.run(sync, capture_output=True, text=True, cwd=work)
    assert second.returncode == 0 and " 0 metric points" in second.stdout, second.stdout

    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("loopline-tiny")
    runs = client.search_runs([exp.experiment_id], max_results=100)
    stages = {r.data.tags.get("loopline.stage"): r for r in runs}
    history = client.get_metric_history(stages["train"].info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 11))
    assert "heff/loss_h1" in stages["eval_heff/step_0000010"].data.metrics
    parent = [r for r in runs if r.data.tags.get("loopline.role") == "parent"]
    assert len(parent) == 1
    assert stages["train"].data.tags["mlflow.parentRunId"] == parent[0].info.run_id
