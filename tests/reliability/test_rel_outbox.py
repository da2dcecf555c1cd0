"""`sync-tracking` uploads only files inside the run directory it syncs (issue 13, "outbox
path escape").

An outbox line is plain text anyone who can write the run directory can append, while
`sync-tracking` may be run by someone else: an ``artifact`` record naming a file outside
the run directory (absolute path, ``..``, a symbolic link, a directory) must be refused
with a one-line error naming the record and the file, nothing uploaded for it, and every
other record still synced.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from support.credentials_helpers import free_port

from pipeline_lib.cli import main
from pipeline_lib.spec.config import Config, ExperimentConfig, TrackingConfig
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.tracking import start_stage
from pipeline_lib.tracking.outbox import Outbox

PRIVATE = "private: not for the tracking server"


@pytest.fixture(scope="module")
def _store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One migrated SQLite store (migrating an empty database costs seconds), copied per test."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("outbox_store") / "mlflow.db"
    assert MlflowClient(f"sqlite:///{db}").get_experiment_by_name("none") is None
    return db


@pytest.fixture
def store(tmp_path: Path, _store_template: Path) -> str:
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(_store_template, db)
    return f"sqlite:///{db}"


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A file outside the run directory that must never be uploaded."""
    path = tmp_path / "home" / "id_rsa"
    path.parent.mkdir()
    path.write_text(PRIVATE)
    return path


def _offline_stage(run_dir: Path, artifact: Path, name: str = "eval_heff") -> str:
    """A stage run while the store is down: metrics and ``artifact`` into the outbox."""
    cfg = Config(tracking=TrackingConfig(uri=f"http://127.0.0.1:{free_port()}"),
                 experiment=ExperimentConfig(name="outbox-test"))
    with start_stage(cfg, run_dir, name) as stage:
        stage.log_metrics(100, {"heff/loss_h1": 3.0})
        stage.log_artifact(artifact, "eval")
    assert stage.offline
    return stage.run_id


def _sync(run_dir: Path, store: str, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    rc = main(["sync-tracking", "--run-dir", str(run_dir), "--uri", store])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def _artifact_files(store: str, run_id: str) -> dict[str, str]:
    """Every artifact file of a run in the store: {path: text}."""
    from mlflow import MlflowClient

    client = MlflowClient(store)
    root = Path(client.get_run(run_id).info.artifact_uri.removeprefix("file://"))
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _real_id(run_dir: Path, store: str, local_id: str) -> str:
    state = json.loads(RunLayout.at(run_dir).outbox_sync_state.read_text())
    return state[store]["ids"][local_id]


def _escape(kind: str, run_dir: Path, private: Path) -> tuple[str, str]:
    """(record path, the file the error must name) for one way out of the run directory."""
    if kind == "absolute":
        return str(private), str(private)
    if kind == "dotdot":
        rel = "../../home/id_rsa"
        return rel, str(run_dir / rel)
    if kind == "symlink":
        link = run_dir / "eval" / "notes.txt"
        link.symlink_to(private)
        return "eval/notes.txt", str(link)
    if kind == "directory":
        return str(private.parent), str(private.parent)
    link = run_dir / "eval" / "tb" / "events.out"  # a link inside a directory record
    link.parent.mkdir(parents=True)
    link.symlink_to(private)
    return "eval/tb", f"{link} (in {run_dir / 'eval' / 'tb'})"


@pytest.mark.parametrize("kind", ["absolute", "dotdot", "symlink", "directory", "link_in_dir"])
def test_artifact_record_escaping_the_run_dir_is_refused_and_the_rest_synced(
        kind: str, tmp_path: Path, store: str, private: Path,
        capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "results" / "base"
    (run_dir / "eval").mkdir(parents=True)
    heff = run_dir / "eval" / "heff.json"
    heff.write_text('{"best_h": 4}')
    local_id = _offline_stage(run_dir, heff)
    record_path, named = _escape(kind, run_dir, private)
    outbox = Outbox(run_dir)
    outbox.append({"op": "artifact", "run": local_id, "path": record_path,
                   "artifact_path": "loot"})
    line = outbox.count()
    outbox.append({"op": "metrics", "run": local_id, "points": [["late/metric", 1.0, 7, 0]]})

    rc, out, err = _sync(run_dir, store, capsys)

    assert rc == 2
    assert err == (f"error: {outbox.path} line {line} (artifact): {named} is outside the run "
                   f"directory {run_dir}; not uploaded; the other records were synced; remove "
                   "such lines from the outbox (sync-tracking uploads only files inside the "
                   "run directory)\n")
    assert "(1 refused)" in out
    run_id = _real_id(run_dir, store, local_id)
    assert _artifact_files(store, run_id) == {"eval/heff.json": '{"best_h": 4}'}  # no loot
    from mlflow import MlflowClient

    metrics = MlflowClient(store).get_run(run_id).data.metrics
    assert metrics == {"heff/loss_h1": 3.0, "late/metric": 1.0}  # the lines after it too
    assert _sync(run_dir, store, capsys)[0] == 0  # reported once; nothing left to replay


def test_outside_file_logged_offline_is_kept_in_the_run_dir_and_synced(
        tmp_path: Path, store: str, capsys: pytest.CaptureFixture) -> None:
    """The pack's metadata.json lives outside the run directory: logged offline it is copied
    under tracking_files/outbox/ (as it was then), the record names the copy relatively,
    and a copy of the whole run directory syncs from its own files."""
    meta = tmp_path / "results" / "data" / "d0" / "metadata.json"
    meta.parent.mkdir(parents=True)
    meta.write_text('{"data_id": "d0"}')
    run_dir = tmp_path / "results" / "base"
    local_id = _offline_stage(run_dir, meta, "pack")
    meta.write_text('{"data_id": "changed later"}')
    records = [r for _, r in Outbox(run_dir).lines() if r and r["op"] == "artifact"]
    assert all(not Path(r["path"]).is_absolute() for r in records)  # the parent's config too
    (record,) = [r for r in records if r["run"] == local_id]
    assert (run_dir / record["path"]).read_text() == '{"data_id": "d0"}'
    assert Path(record["path"]).parts[:2] == ("tracking_files", "outbox")

    moved = tmp_path / "elsewhere" / "base"
    shutil.copytree(run_dir, moved)
    shutil.rmtree(run_dir)  # the original is gone: only the copy's files can be uploaded
    rc, out, err = _sync(moved, store, capsys)
    assert (rc, err) == (0, "")
    assert "0 skipped" in out and "refused" not in out
    assert _artifact_files(store, _real_id(moved, store, local_id)) == {
        "eval/metadata.json": '{"data_id": "d0"}'}


def test_older_outbox_with_absolute_paths_inside_the_run_dir_still_syncs(
        tmp_path: Path, store: str, capsys: pytest.CaptureFixture) -> None:
    run_dir = tmp_path / "results" / "base"
    (run_dir / "eval").mkdir(parents=True)
    table = run_dir / "eval" / "table.csv"
    table.write_text("h,loss\n1,3.0\n")
    local_id = _offline_stage(run_dir, table)
    Outbox(run_dir).append({"op": "artifact", "run": local_id, "path": str(table.absolute()),
                            "artifact_path": "old"})
    rc, _, err = _sync(run_dir, store, capsys)
    assert (rc, err) == (0, "")
    assert _artifact_files(store, _real_id(run_dir, store, local_id)) == {
        "eval/table.csv": "h,loss\n1,3.0\n", "old/table.csv": "h,loss\n1,3.0\n"}


def test_stage_replaying_a_pending_outbox_refuses_the_escape_and_keeps_running(
        tmp_path: Path, store: str, private: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A later stage that reaches the store replays the outbox on its own: the bad record
    is refused with the same error line, the stage is not failed by it."""
    run_dir = tmp_path / "results" / "base"
    (run_dir / "eval").mkdir(parents=True)
    heff = run_dir / "eval" / "heff.json"
    heff.write_text("{}")
    local_id = _offline_stage(run_dir, heff)
    Outbox(run_dir).append({"op": "artifact", "run": local_id, "path": str(private),
                            "artifact_path": "loot"})
    line = Outbox(run_dir).count()
    cfg = Config(tracking=TrackingConfig(uri=store), experiment=ExperimentConfig(name="outbox-test"))
    with caplog.at_level(logging.ERROR, logger="pipeline_lib.tracking"):
        with start_stage(cfg, run_dir, "bench") as stage:
            stage.log_metrics(1, {"bench/acc": 0.5})
    assert not stage.offline
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"{Outbox(run_dir).path} line {line} (artifact): {private} is outside the run "
                      f"directory {run_dir}; not uploaded"]
    assert _artifact_files(store, _real_id(run_dir, store, local_id)) == {"eval/heff.json": "{}"}
