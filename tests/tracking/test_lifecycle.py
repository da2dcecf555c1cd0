"""The parent run's status follows its pipeline's jobs: RUNNING while they run, FAILED when one
fails, RUNNING again on a retry, FINISHED at the end; a stage run alone leaves it alone."""

from __future__ import annotations

from pathlib import Path

import pytest
from tracking_helpers import client, free_port, make_config

from pipeline_lib.errors import Preempted, TrainingError
from pipeline_lib.spec.config import Config
from pipeline_lib.tracking import (
    finish_parent,
    init_parent_run,
    is_open,
    pipeline_job,
    start_stage,
    sync_outbox,
)


def _status(uri: str, run_id: str) -> str:
    return client(uri).get_run(run_id).info.status


def test_parent_status_follows_the_pipeline_jobs(cfg: Config, run_dir: Path,
                                                 store_uri: str) -> None:
    with pipeline_job(cfg, run_dir):  # track_init: the parent is made inside the job
        parent = init_parent_run(cfg, "base", run_dir, "d0")["parent_run_id"]
        assert not is_open(run_dir)
    assert _status(store_uri, parent) == "RUNNING" and is_open(run_dir)
    with pipeline_job(cfg, run_dir), start_stage(cfg, run_dir, "eval_heff/final"):
        pass
    assert _status(store_uri, parent) == "RUNNING"  # a job done, the pipeline not
    with pytest.raises(TrainingError, match="spike"):
        with pipeline_job(cfg, run_dir):
            raise TrainingError("spike abort")
    assert _status(store_uri, parent) == "FAILED"
    with pipeline_job(cfg, run_dir):  # Snakemake's retry
        assert _status(store_uri, parent) == "RUNNING"
    with pytest.raises(Preempted):
        with pipeline_job(cfg, run_dir):
            raise Preempted("time limit")
    assert _status(store_uri, parent) == "RUNNING"  # retried from its resume point
    assert finish_parent(cfg, run_dir, "FINISHED") == parent
    info = client(store_uri).get_run(parent).info
    assert info.status == "FINISHED" and info.end_time > info.start_time
    assert not is_open(run_dir)


def test_a_stage_run_alone_leaves_the_parent_status(cfg: Config, run_dir: Path,
                                                    store_uri: str) -> None:
    parent = init_parent_run(cfg, "base", run_dir, "d0")["parent_run_id"]
    before = client(store_uri).get_run(parent).info
    with pytest.raises(RuntimeError):
        with start_stage(cfg, run_dir, "eval_heff/final"):
            raise RuntimeError("boom")
    after = client(store_uri).get_run(parent).info
    assert (after.status, after.end_time) == (before.status, before.end_time) == (
        "FINISHED", before.start_time)
    assert not is_open(run_dir)


def test_offline_status_changes_are_replayed_in_order(cfg: Config, run_dir: Path,
                                                      store_uri: str,
                                                      request: pytest.FixtureRequest) -> None:
    dead = make_config(f"http://127.0.0.1:{free_port()}", request.node.name)
    with pipeline_job(dead, run_dir):
        init_parent_run(dead, "base", run_dir, "d0")
    with pytest.raises(ValueError):
        with pipeline_job(dead, run_dir):
            raise ValueError("bad")
    with pipeline_job(dead, run_dir):
        pass
    assert finish_parent(dead, run_dir, "FINISHED").startswith("local:")
    assert not is_open(run_dir)
    sync_outbox(run_dir, store_uri)
    exp = client(store_uri).get_experiment_by_name(cfg.experiment.name).experiment_id
    [parent] = client(store_uri).search_runs([exp], "tags.`loopline.role` = 'parent'")
    assert parent.info.status == "FINISHED" and parent.info.end_time >= parent.info.start_time


def test_status_bookkeeping_never_masks_the_job(cfg: Config, run_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    init_parent_run(cfg, "base", run_dir, "d0")
    import pipeline_lib.tracking.lifecycle as lifecycle

    def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("bookkeeping broke")

    monkeypatch.setattr(lifecycle, "parent_for_stage", broken)
    with pytest.raises(KeyError, match="job's own"):
        with pipeline_job(cfg, run_dir):
            raise KeyError("job's own error")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 2 and all("bookkeeping broke" in w for w in warnings)


def test_a_store_the_job_cannot_use_is_refused_before_the_job(tmp_path: Path) -> None:
    """The store is checked before it is touched (a plain file store here; a missing or
    reset one in tests/reliability and tests/workflow/test_tiny_pipeline.py)."""
    from pipeline_lib.errors import TrackingError

    cfg = make_config("file:///nowhere", "masked")
    run_dir = tmp_path / "results" / "base"
    run_dir.mkdir(parents=True)
    (run_dir / "tracking.json").write_text('{"parent_run_id": "p1", "tracking_uri": "x"}')
    ran = []
    with pytest.raises(TrackingError, match="plain file store"):
        with pipeline_job(cfg, run_dir):
            ran.append(True)
    assert not ran
