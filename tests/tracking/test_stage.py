"""Stage child runs: parent link, buffered batches, exactly-once segments, parallel writers."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tracking_helpers import children, client, make_config, steps_of

from pipeline_lib.errors import TrackingError
from pipeline_lib.spec.config import Config
from pipeline_lib.tracking import init_parent_run, read_tracking_info, start_stage
from pipeline_lib.tracking.store import normalize_uri

WORKER = Path(__file__).with_name("tracking_worker.py")


def _worker(cfg: Config, run_dir: Path, stage: str, run_id: str | None, first: int, last: int,
            flush_every: int = 0, crash_after: int = -1) -> subprocess.Popen:
    args = [sys.executable, str(WORKER), cfg.tracking.uri, cfg.experiment.name, str(run_dir),
            stage, run_id or "-", str(first), str(last), str(flush_every), str(crash_after)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def test_child_run_is_linked_to_the_parent(cfg: Config, run_dir: Path, store_uri: str) -> None:
    info = init_parent_run(cfg, "base", run_dir, "d0")
    with start_stage(cfg, run_dir, "heff_step0000010", params={"h_eff": [1, 2]},
                     tags={"loopline.step": 10}) as stage:
        stage.log_metrics(10, {"heff/loss_h1": 2.5, "heff/loss_h2": 2.25})
        stage.set_tags({"deeper_better": True})
    run = client(store_uri).get_run(stage.run_id)
    assert run.data.tags["mlflow.parentRunId"] == info["parent_run_id"]
    assert run.data.tags["loopline.stage"] == "heff_step0000010"
    assert run.data.tags["loopline.run"] == "base"
    assert run.data.tags["loopline.step"] == "10"
    assert run.data.tags["deeper_better"] == "True"
    assert run.data.params == {"h_eff": "[1, 2]"}
    assert run.data.metrics == {"heff/loss_h1": 2.5, "heff/loss_h2": 2.25}
    assert run.info.status == "FINISHED" and run.info.run_name == "heff_step0000010"
    found = children(store_uri, info["experiment_id"], info["parent_run_id"])
    assert [r.info.run_id for r in found] == [stage.run_id]


def test_metrics_are_buffered_then_committed_in_batches(cfg: Config, run_dir: Path,
                                                        store_uri: str) -> None:
    stage = start_stage(cfg, run_dir, "train")
    for step in range(1, 1201):
        stage.log_metrics(step, {"train/loss": 10.0 / step, "train/lr": 1e-3, "train/gn": 0.5})
    assert stage.pending == 3600
    assert steps_of(store_uri, stage.run_id, "train/loss") == []  # nothing before the commit
    assert stage.flush(through_step=700) == 2100
    assert stage.pending == 1500
    assert steps_of(store_uri, stage.run_id, "train/lr") == list(range(1, 701))
    stage.end()
    for key in ("train/loss", "train/lr", "train/gn"):
        assert steps_of(store_uri, stage.run_id, key) == list(range(1, 1201))
    history = client(store_uri).get_metric_history(stage.run_id, "train/loss")
    assert {m.step: m.value for m in history}[400] == pytest.approx(0.025)


def test_failed_stage_discards_uncommitted_points(cfg: Config, run_dir: Path,
                                                  store_uri: str) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with start_stage(cfg, run_dir, "bench") as stage:
            stage.log_metrics(1, {"bench/acc": 0.5})
            raise RuntimeError("boom")
    run = client(store_uri).get_run(stage.run_id)
    assert run.info.status == "FAILED"
    assert run.data.metrics == {}


def test_invalid_metric_name_fails_at_log_time(cfg: Config, run_dir: Path) -> None:
    stage = start_stage(cfg, run_dir, "train")
    with pytest.raises(TrackingError, match="not allowed"):
        stage.log_metrics(1, {"train//loss": 1.0})
    stage.end("FAILED")


def test_artifacts_are_logged(cfg: Config, run_dir: Path, store_uri: str, tmp_path: Path) -> None:
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "events.out").write_bytes(b"\x00\x01")
    (tmp_path / "heff.json").write_text("{}")
    with start_stage(cfg, run_dir, "train") as stage:
        stage.log_artifact(tmp_path / "heff.json", "eval")
        stage.log_artifact(tmp_path / "tb", "tensorboard")
    c = client(store_uri)
    assert [a.path for a in c.list_artifacts(stage.run_id, "eval")] == ["eval/heff.json"]
    assert [a.path for a in c.list_artifacts(stage.run_id, "tensorboard")] == [
        "tensorboard/events.out"]


@pytest.mark.parametrize("committed_before_crash", [10, 15, 20])
def test_segment_retry_logs_every_step_exactly_once(cfg: Config, run_dir: Path, store_uri: str,
                                                    committed_before_crash: int) -> None:
    """Segment 2 (steps 11..20) dies after committing through some step; the retry repeats it."""
    with start_stage(cfg, run_dir, "train") as seg1:
        for step in range(1, 11):
            seg1.log_metrics(step, {"train/loss": float(step)})
    train_id = seg1.run_id  # what the trainer keeps in the snapshot

    attempt = start_stage(cfg, run_dir, "train", run_id=train_id)
    for step in range(11, 21):
        attempt.log_metrics(step, {"train/loss": float(step)})
    attempt.flush(through_step=committed_before_crash)  # …then the process dies: no end()

    with start_stage(cfg, run_dir, "train", run_id=train_id) as retry:
        for step in range(11, 21):
            retry.log_metrics(step, {"train/loss": step + 0.5})
    assert retry.run_id == train_id
    history = client(store_uri).get_metric_history(train_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 21))
    values = {m.step: m.value for m in history}
    # the first committed value of a step wins
    assert [values[s] for s in range(11, 21)] == [
        s if s <= committed_before_crash else s + 0.5 for s in range(11, 21)]
    assert client(store_uri).get_run(train_id).info.status == "FINISHED"


def test_crash_in_another_process_between_snapshot_and_commit(cfg: Config, run_dir: Path,
                                                              store_uri: str) -> None:
    init_parent_run(cfg, "base", run_dir, "d0")
    proc = _worker(cfg, run_dir, "train", None, 1, 30, crash_after=25)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    train_id = out.split()[0]
    assert steps_of(store_uri, train_id, "worker/loss") == list(range(1, 26))
    assert client(store_uri).get_run(train_id).info.status == "RUNNING"  # died mid-segment

    proc = _worker(cfg, run_dir, "train", train_id, 21, 40, flush_every=7)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.split()[0] == train_id
    assert steps_of(store_uri, train_id, "worker/loss") == list(range(1, 41))
    assert client(store_uri).get_run(train_id).info.status == "FINISHED"


def test_two_parallel_writers_lose_nothing(run_dir: Path, tmp_path: Path) -> None:
    """Two jobs log 300 points each (60 batches) to one SQLite store at the same time.

    The store is brand new and tracking.json absent, so the two also race on the schema
    migration and on creating the parent run: both must end up under one parent.
    """
    uri = normalize_uri(f"sqlite:///{tmp_path}/fresh/mlflow.db")
    cfg = make_config(uri, "parallel")
    procs = [_worker(cfg, run_dir, f"eval_{i}", None, 1, 300, flush_every=5) for i in range(2)]
    results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-2000:] for r in results]
    run_ids = [out.split()[0] for out, _ in results]
    for run_id in run_ids:
        assert steps_of(uri, run_id, "worker/loss") == list(range(1, 301))
    info = read_tracking_info(run_dir)
    found = children(uri, info["experiment_id"], info["parent_run_id"])
    assert sorted(r.info.run_id for r in found) == sorted(run_ids)
    assert len(client(uri).search_runs([info["experiment_id"]])) == 3


def test_unknown_run_id_starts_a_new_run_with_a_warning(
        cfg: Config, run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.tracking"):
        stage = start_stage(cfg, run_dir, "train", run_id="0123456789abcdef0123456789abcdef")
    assert stage.run_id != "0123456789abcdef0123456789abcdef"
    assert any("not in" in r.getMessage() for r in caplog.records)
    stage.end()


def test_system_metrics_are_logged_when_enabled(cfg: Config, run_dir: Path, store_uri: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.1")
    cfg.tracking.system_metrics = True
    stage = start_stage(cfg, run_dir, "train")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # bounded wait for the monitor's first sample
        if any(k.startswith("system/") for k in client(store_uri).get_run(stage.run_id).data.metrics):
            break
        time.sleep(0.2)
    stage.end()
    keys = client(store_uri).get_run(stage.run_id).data.metrics
    assert "system/cpu_utilization_percentage" in keys
