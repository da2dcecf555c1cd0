"""Against a real `mlflow server --workers 1` on a loopback port, read back over its REST API."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.mlflow_server import Server
from tracking_helpers import client, free_port, make_config, steps_of

from pipeline_lib.tracking import init_parent_run, start_stage, sync_outbox


def _get(base: str, endpoint: str, **query: str) -> dict:
    url = f"{base}/api/2.0/mlflow/{endpoint}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def _module_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(tmp_path_factory.mktemp("mlflow_server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def mlflow_server(_module_server: Server) -> Server:
    """One server per module (startup is the slow part), restarted if a test stopped it."""
    if _module_server.proc is None or _module_server.proc.poll() is not None:
        _module_server.start()
    return _module_server


@pytest.mark.slow
def test_runs_structure_and_history_through_the_rest_api(mlflow_server: Server,
                                                         tmp_path: Path) -> None:
    base = mlflow_server.base
    cfg = make_config(base, "server-test")
    run_dir = tmp_path / "results" / "base"
    info = init_parent_run(cfg, "base", run_dir, "d0")
    (tmp_path / "summary.json").write_text("{}")
    with start_stage(cfg, run_dir, "train") as train:
        for step in range(1, 121):
            train.log_metrics(step, {"train/loss": 5.0 - step / 100})
        train.log_artifact(tmp_path / "summary.json", "bench")
    # a second run directory whose stages ran while the tracking server was down
    offline_dir = tmp_path / "results" / "deep"
    dead = make_config(f"http://127.0.0.1:{free_port()}", "server-test")
    with start_stage(dead, offline_dir, "train") as deep:
        for step in range(1, 41):
            deep.log_metrics(step, {"train/loss": 1.0})
    assert deep.offline
    assert sync_outbox(offline_dir, base).metrics == 40

    exp = _get(base, "experiments/get-by-name", experiment_name="server-test")
    assert exp["experiment"]["experiment_id"] == info["experiment_id"]
    runs = _post(base, "runs/search",
                 {"experiment_ids": [info["experiment_id"]], "max_results": 100})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])}
            for r in runs}
    parents = {t["loopline.run"]: rid for rid, t in tags.items() if t.get("loopline.role") == "parent"}
    assert set(parents) == {"base", "deep"} and parents["base"] == info["parent_run_id"]
    kids = {rid: t for rid, t in tags.items() if "mlflow.parentRunId" in t}
    assert {(t["loopline.run"], t["mlflow.parentRunId"]) for t in kids.values()} == {
        ("base", parents["base"]), ("deep", parents["deep"])}
    assert len(runs) == 4

    history = _get(base, "metrics/get-history", run_id=train.run_id,
                   metric_key="train/loss")["metrics"]
    assert sorted(int(m.get("step", 0)) for m in history) == list(range(1, 121))
    assert {int(m["step"]): m["value"] for m in history}[50] == pytest.approx(4.5)
    deep_id = next(rid for rid, t in kids.items() if t["loopline.run"] == "deep")
    deep_history = _get(base, "metrics/get-history", run_id=deep_id,
                        metric_key="train/loss")["metrics"]
    assert sorted(int(m["step"]) for m in deep_history) == list(range(1, 41))
    files = _get(base, "artifacts/list", run_id=train.run_id, path="bench")
    assert [f["path"] for f in files["files"]] == ["bench/summary.json"]


@pytest.mark.slow
def test_server_dying_mid_stage_fills_the_outbox_and_sync_delivers(
        mlflow_server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = make_config(mlflow_server.base, "server-dies")
    run_dir = tmp_path / "results" / "late"
    stage = start_stage(cfg, run_dir, "train")
    for step in range(1, 31):
        stage.log_metrics(step, {"train/loss": float(step)})
    mlflow_server.stop()
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.tracking"):
        stage.end()  # the commit fails over to the outbox; the stage itself goes on
    assert stage.offline
    assert sum("unreachable" in r.getMessage() for r in caplog.records) == 1
    # replay straight into the server's database (no second server start: it is slow)
    db_uri = f"sqlite:///{mlflow_server.root / 'server.db'}"
    assert sync_outbox(run_dir, db_uri).metrics == 30
    assert sync_outbox(run_dir, db_uri).metrics == 0
    assert steps_of(db_uri, stage.run_id, "train/loss") == list(range(1, 31))
    assert client(db_uri).get_run(stage.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_a_server_whose_store_was_wiped_is_named_so_before_the_work(
        mlflow_server: Server, tmp_path: Path) -> None:
    """The server's database deleted and the server restarted on a new one: the next stage
    is refused in one line saying the server's store was deleted or replaced, with fixes
    that put nothing over the new store (issue 39, class 9; the message said "reset" and
    "restore the file", though a server has no file of ours)."""
    from pipeline_lib.errors import TrackingError
    from pipeline_lib.tracking.health import check_store

    cfg = make_config(mlflow_server.base, "server-wiped")
    run_dir = tmp_path / "results" / "wiped"
    info = init_parent_run(cfg, "wiped", run_dir, "d0")
    check_store(cfg, run_dir)  # the store the run knows: nothing to say
    mlflow_server.stop()
    (mlflow_server.root / "server.db").unlink()
    mlflow_server.start()
    with pytest.raises(TrackingError) as caught:
        check_store(cfg, run_dir)
    assert str(caught.value) == (
        f"tracking store {mlflow_server.base} holds no experiment {info['experiment_id']} "
        f"('server-wiped') that {run_dir / 'tracking.json'} names: the server's store was "
        "deleted or replaced since; point tracking.uri at the store that holds it, or to "
        f"start over in this one run `python -m pipeline_lib track-init --run-dir {run_dir} "
        "--data DATA_DIR` and replay outboxes with `python -m pipeline_lib sync-tracking "
        f"--run-dir {run_dir}`")
