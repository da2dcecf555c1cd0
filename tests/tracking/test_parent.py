"""Parent runs: idempotent creation, provenance tags, params once, tracking.json."""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

import pytest
from tracking_helpers import client

from pipeline_lib.spec.config import Config
from pipeline_lib.spec.config_write import config_hash, flatten, to_dict
from pipeline_lib.tracking import init_parent_run, read_tracking_info, start_stage
from pipeline_lib.tracking.parent import git_state
from pipeline_lib.workflow.resolve import resolve_run


def test_parent_is_created_once_with_tags_and_params(cfg: Config, run_dir: Path,
                                                     store_uri: str) -> None:
    info = init_parent_run(cfg, "base", run_dir, "d0123")
    stamp = (run_dir / "tracking.json").stat().st_mtime_ns
    again = init_parent_run(cfg, "base", run_dir, "d0123")

    assert again == info
    assert read_tracking_info(run_dir) == info
    assert (run_dir / "tracking.json").stat().st_mtime_ns == stamp  # unchanged: no rewrite
    assert info["tracking_uri"] == store_uri
    assert info["experiment_name"] == cfg.experiment.name
    runs = client(store_uri).search_runs([info["experiment_id"]])
    assert [r.info.run_id for r in runs] == [info["parent_run_id"]]

    run = runs[0]
    tags = run.data.tags
    assert tags["loopline.run"] == "base"
    assert tags["loopline.role"] == "parent"
    assert tags["loopline.config_hash"] == config_hash(cfg)
    assert tags["loopline.data_id"] == "d0123"
    commit, dirty = git_state()
    assert (tags["loopline.git_commit"], tags["loopline.git_dirty"]) == (commit, dirty)
    import mlflow
    import snakemake
    import torch

    assert tags["loopline.version.mlflow"] == mlflow.__version__
    assert tags["loopline.version.torch"] == torch.__version__
    assert tags["loopline.version.snakemake"] == snakemake.__version__
    assert run.info.run_name == "base"

    params = run.data.params
    assert len(params) == len(flatten(to_dict(cfg)))
    assert params["train.lr"] == "0.003"
    assert params["model.loops"] == "4"
    assert params["tracking.enabled"] == "True"
    sources = json.loads(params["data.sources"])
    assert [s["type"] for s in sources] == ["stdlib", "reasoning"]
    artifacts = client(store_uri).list_artifacts(info["parent_run_id"], "config")
    assert [a.path for a in artifacts] == [f"config/config_{config_hash(cfg)}.yaml"]


def test_changed_config_keeps_first_params_tags_the_change_and_warns(
        cfg: Config, run_dir: Path, store_uri: str, caplog: pytest.LogCaptureFixture) -> None:
    first = init_parent_run(cfg, "base", run_dir, "d0")
    cfg.train.lr = 1e-3
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.tracking"):
        second = init_parent_run(cfg, "base", run_dir, "d0")

    assert second["parent_run_id"] == first["parent_run_id"]
    run = client(store_uri).get_run(first["parent_run_id"])
    assert run.data.params["train.lr"] == "0.003"  # MLflow params are immutable
    assert run.data.tags["loopline.params_changed"] == "train.lr"
    assert run.data.tags["loopline.config_hash"] == config_hash(cfg)
    assert sum("train.lr" in r.getMessage() for r in caplog.records) == 1
    stored = {a.path for a in client(store_uri).list_artifacts(first["parent_run_id"], "config")}
    assert len(stored) == 2  # both resolved configs are kept


def test_the_variant_resolved_for_its_run_is_logged(cfg: Config, tmp_path: Path,
                                                    store_uri: str) -> None:
    cfg.runs = {"deep": {"model": {"loops": 8}}}
    resolved = resolve_run(cfg, "deep").config  # tracking completes nothing itself
    info = init_parent_run(resolved, "deep", tmp_path / "results" / "deep", None)
    run = client(store_uri).get_run(info["parent_run_id"])
    assert run.data.params["model.loops"] == "8"
    assert run.data.tags["loopline.data_id"] == "unknown"


def test_disabled_tracking_writes_tracking_json_and_touches_no_store(
        cfg: Config, run_dir: Path, store_uri: str) -> None:
    cfg.tracking.enabled = False
    cfg.tracking.uri = f"sqlite:///{run_dir.parent}/never.db"
    info = init_parent_run(cfg, "base", run_dir, "d0")
    assert info["enabled"] is False and info["parent_run_id"] is None
    assert read_tracking_info(run_dir) == info
    assert not (run_dir.parent / "never.db").exists()
    stage = start_stage(cfg, run_dir, "train")
    stage.log_metrics(1, {"train/loss": 1.0})
    assert (stage.run_id, stage.enabled, stage.flush()) == (None, False, 0)
    stage.end()


def test_stage_without_tracking_json_creates_the_parent_on_first_use(
        cfg: Config, run_dir: Path, store_uri: str) -> None:
    with start_stage(cfg, run_dir, "pack") as stage:
        stage.log_metrics(0, {"data/rows": 12})
    info = read_tracking_info(run_dir)
    assert info is not None and info["tracking_uri"] == store_uri
    parent = client(store_uri).get_run(info["parent_run_id"])
    assert parent.data.tags["loopline.run"] == "base"
    assert parent.data.tags["loopline.config_hash"] == config_hash(cfg)
    assert stage.parent_run_id == info["parent_run_id"]
    # track_init afterwards finds the same parent instead of creating a second one
    assert init_parent_run(cfg, "base", run_dir, "d1")["parent_run_id"] == info["parent_run_id"]


def test_git_state_reads_commit_and_dirty_flag(tmp_path: Path) -> None:
    assert git_state(tmp_path) == ("unknown", "unknown")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("1")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert git_state(repo) == (head, "false")
    (repo / "a.txt").write_text("2")
    assert git_state(repo) == (head, "true")
