"""Unreachable store → outbox → sync: every metric once, replays idempotent and resumable."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from tracking_helpers import children, client, free_port, make_config, steps_of

from pipeline_lib.cli import main
from pipeline_lib.spec.config import Config
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.tracking import init_parent_run, read_tracking_info, start_stage, sync_outbox
from pipeline_lib.tracking.outbox import Outbox
from pipeline_lib.tracking.runs import find_parent
from pipeline_lib.tracking.store import ensure_store


def _offline_pipeline(cfg: Config, run_dir: Path, artifact: Path) -> tuple[str, str]:
    """track_init, two train segments (the second crashes once and is retried), one eval."""
    init_parent_run(cfg, "base", run_dir, "d0")
    with start_stage(cfg, run_dir, "train", params={"seg": 0}) as seg:
        for step in range(1, 51):
            seg.log_metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.01})
    train_id = seg.run_id
    crashed = start_stage(cfg, run_dir, "train", run_id=train_id)
    for step in range(51, 101):
        crashed.log_metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.01})
    crashed.flush(through_step=75)  # dies here: no end()
    with start_stage(cfg, run_dir, "train", run_id=train_id) as retry:
        for step in range(51, 101):
            retry.log_metrics(step, {"train/loss": 1.0 / step, "train/lr": 0.01})
    with start_stage(cfg, run_dir, "heff_step0000100", params={"h_eff": [1, 4]}) as ev:
        ev.log_metrics(100, {"heff/loss_h1": 3.0, "heff/loss_h4": 2.0, "heff/best_h": 4})
        ev.log_artifact(artifact, "eval")
    return train_id, ev.run_id


@pytest.fixture
def dead_cfg(request: pytest.FixtureRequest) -> Config:
    return make_config(f"http://127.0.0.1:{free_port()}", request.node.name)


def test_unreachable_store_goes_to_outbox_then_syncs_exactly_once(
        dead_cfg: Config, run_dir: Path, store_uri: str, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    artifact = tmp_path / "heff.json"
    artifact.write_text('{"best_h": 4}')
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.tracking"):
        train_id, eval_id = _offline_pipeline(dead_cfg, run_dir, artifact)
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1  # warned once
    assert train_id.startswith("local:") and eval_id.startswith("local:")
    info = read_tracking_info(run_dir)
    assert info["parent_run_id"].startswith("local:") and info["experiment_id"] is None
    assert RunLayout.at(run_dir).outbox.is_file()

    report = sync_outbox(run_dir, store_uri)
    assert (report.runs, report.metrics, report.skipped) == (3, 203, 0)
    ids = json.loads(RunLayout.at(run_dir).outbox_sync_state.read_text())[store_uri]["ids"]
    exp_id = ensure_store(store_uri, dead_cfg.experiment.name)
    parent = find_parent(client(store_uri), exp_id, "base")
    assert parent == ids[info["parent_run_id"]]
    kids = children(store_uri, exp_id, parent)
    assert sorted(r.info.run_id for r in kids) == sorted([ids[train_id], ids[eval_id]])
    for key in ("train/loss", "train/lr"):
        assert steps_of(store_uri, ids[train_id], key) == list(range(1, 101))
    train = client(store_uri).get_run(ids[train_id])
    assert train.info.status == "FINISHED" and train.data.params == {"seg": "0"}
    ev = client(store_uri).get_run(ids[eval_id])
    assert ev.data.metrics == {"heff/loss_h1": 3.0, "heff/loss_h4": 2.0, "heff/best_h": 4.0}
    assert ev.data.params == {"h_eff": "[1, 4]"}
    assert [a.path for a in client(store_uri).list_artifacts(ids[eval_id], "eval")] == [
        "eval/heff.json"]
    parent_run = client(store_uri).get_run(parent)
    assert parent_run.data.tags["loopline.data_id"] == "d0"
    assert parent_run.data.params["train.lr"] == "0.003"

    # a second sync reads nothing; a lost progress file replays everything and adds nothing
    again = sync_outbox(run_dir, store_uri)
    assert (again.records, again.metrics) == (0, 0)
    RunLayout.at(run_dir).outbox_sync_state.unlink()
    replay = sync_outbox(run_dir, store_uri)
    assert replay.records == Outbox(run_dir).count() and replay.metrics == 0
    assert len(client(store_uri).search_runs([exp_id])) == 3
    assert steps_of(store_uri, ids[train_id], "train/loss") == list(range(1, 101))


def test_offline_track_init_is_idempotent(dead_cfg: Config, run_dir: Path) -> None:
    first = init_parent_run(dead_cfg, "base", run_dir, "d0")
    stamp = (run_dir / "tracking.json").stat().st_mtime_ns
    assert init_parent_run(dead_cfg, "base", run_dir, "d0") == first
    assert (run_dir / "tracking.json").stat().st_mtime_ns == stamp
    parents = [r for _, r in Outbox(run_dir).lines() if r["op"] == "parent"]
    assert {r["id"] for r in parents} == {first["parent_run_id"]}


def test_sync_resumes_with_only_new_records(dead_cfg: Config, run_dir: Path,
                                            store_uri: str) -> None:
    with start_stage(dead_cfg, run_dir, "pack") as pack:
        pack.log_metrics(0, {"data/rows": 7})
    first = sync_outbox(run_dir, store_uri)
    lines = Outbox(run_dir).count()
    with start_stage(dead_cfg, run_dir, "bench") as bench:
        bench.log_metrics(100, {"bench/khop/acc_h4": 0.75})
    second = sync_outbox(run_dir, store_uri)
    assert second.records == Outbox(run_dir).count() - lines
    assert (first.metrics, second.metrics, second.runs) == (1, 1, 1)


def test_next_stage_with_a_reachable_store_replays_and_continues_the_run(
        dead_cfg: Config, run_dir: Path, store_uri: str) -> None:
    """Segment 1 ran offline; segment 2 finds the store: one continuous train curve."""
    init_parent_run(dead_cfg, "base", run_dir, "d0")
    with start_stage(dead_cfg, run_dir, "train") as seg1:
        for step in range(1, 31):
            seg1.log_metrics(step, {"train/loss": float(step)})
    online_cfg = make_config(store_uri, dead_cfg.experiment.name)
    with start_stage(online_cfg, run_dir, "train", run_id=seg1.run_id) as seg2:
        for step in range(31, 61):
            seg2.log_metrics(step, {"train/loss": float(step)})
    assert not seg2.offline and not seg2.run_id.startswith("local:")
    assert steps_of(store_uri, seg2.run_id, "train/loss") == list(range(1, 61))
    run = client(store_uri).get_run(seg2.run_id)
    assert run.data.tags["mlflow.parentRunId"] == seg2.parent_run_id


def test_cli_track_init_and_sync_tracking(tmp_path: Path, store_uri: str,
                                          capsys: pytest.CaptureFixture) -> None:
    results = tmp_path / "results"
    dead = tmp_path / "dead.yaml"
    dead.write_text(f"experiment:\n  name: cli\n  results_dir: {results}\n"
                    f"tracking:\n  uri: http://127.0.0.1:{free_port()}\n")
    data = results / "data" / "d9"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text('{"data_id": "d9", "num_docs": 3}')
    assert main(["track-init", "--config", str(dead), "--run-dir", str(results / "a"),
                 "--data", str(data)]) == 0
    assert capsys.readouterr().out.strip().startswith("local:")
    live = tmp_path / "live.yaml"
    live.write_text(f"experiment:\n  name: cli\n  results_dir: {results}\n"
                    f"tracking:\n  uri: {store_uri}\n")
    assert main(["sync-tracking", "--config", str(live)]) == 0
    assert "2 runs" in capsys.readouterr().out  # the parent and its pack child
    assert main(["sync-tracking", "--config", str(live)]) == 0
    assert "0 records" in capsys.readouterr().out
    assert main(["track-init", "--config", str(live), "--run-dir", str(results / "a"),
                 "--data", str(data)]) == 0
    parent = capsys.readouterr().out.strip()
    exp_id = ensure_store(store_uri, "cli")
    assert find_parent(client(store_uri), exp_id, "a") == parent
    assert main(["sync-tracking", "--config", str(dead)]) == 2  # unreachable target: one line
    assert "cannot reach tracking store" in capsys.readouterr().err
