"""Credentials in the tracking URI are used, never written (issue 13, "credentials").

The worst case runs the real stage commands with ``http://USER:PASSWORD@127.0.0.1:PORT`` and
then searches every file they wrote, their whole output, the outbox and, after a sync, the
MLflow store itself for the user name and the password.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from support.credentials_helpers import (
    TINY_TRAIN,
    AuthServer,
    files_containing,
    free_port,
    mlflow_env,
    run_cli,
)

from pipeline_lib.cli import main
from pipeline_lib.credentials import redact_uri, split_credentials
from pipeline_lib.spec.config import DataConfig, SourceConfig
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.config_write import config_hash, config_yaml, public_dict
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.tracking.store import probe, resolve_uri, store_uri

USER, PASSWORD = "loopuser7", "s3cr3t-Pw"
DATA = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=60, max_difficulty=2, seed=1)],
                  seq_len=32, epochs=2, val_fraction=0.1, seed=3)


@pytest.fixture(autouse=True)
def _clean_env() -> Iterator[None]:
    with mlflow_env():
        yield


def _leaks(root: Path) -> list[Path]:
    return files_containing(root, PASSWORD) + files_containing(root, USER)


def _tiny_config_file(path: Path) -> Path:
    cfg = load_config(None, TINY_TRAIN)
    data = {**yaml.safe_load(config_yaml(cfg)), "data": public_dict(DATA)}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.slow
def test_offline_train_segment_writes_no_credentials_anywhere(tmp_path: Path) -> None:
    """The worst case: a training segment, tracking to a password URI that does not answer
    (everything goes to the outbox), then the outbox synced into a real store."""
    from pipeline_lib.data.pack import pack_corpus
    from pipeline_lib.tracking import sync_outbox

    pack = tmp_path / "results" / "data" / "d0"
    pack_corpus(DATA, pack)
    run = tmp_path / "results" / "base"
    bare = f"http://127.0.0.1:{free_port()}"
    uri = bare.replace("://", f"://{USER}:{PASSWORD}@")
    done = run_cli(["train", "--config", str(_tiny_config_file(tmp_path / "tiny.yaml")),
                    "--data", str(pack), "--resume-from", "none", "--until-step", "2",
                    "--out", str(run / "snapshots" / "step_0000002"), f"tracking.uri={uri}"],
                   cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "unreachable" in done.stdout and bare in done.stdout  # the bare URI is named
    assert PASSWORD not in done.stdout and USER not in done.stdout
    layout = RunLayout.at(run)
    assert json.loads(layout.tracking_json.read_text())["tracking_uri"] == bare
    snapshot_cfg = yaml.safe_load((run / "snapshots" / "step_0000002" / "config.yaml").read_text())
    assert snapshot_cfg["tracking"]["uri"] == bare
    assert layout.outbox.stat().st_size > 0 and _leaks(tmp_path) == []

    store = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    report = sync_outbox(run, store)
    assert report.runs == 2 and report.skipped == 0 and report.refused == []
    from mlflow import MlflowClient

    runs = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name(
        "loopline-default").experiment_id])
    assert {r.data.params["tracking.uri"] for r in runs} == {bare}  # parent and train params
    assert json.loads(layout.outbox_sync_state.read_text()).keys() == {store}
    assert _leaks(tmp_path) == []  # the store's database and artifacts included


def test_track_init_with_password_in_env_uri_goes_to_outbox_without_it(tmp_path: Path) -> None:
    """MLFLOW_TRACKING_URI with userinfo, store unreachable: tracking.json, the outbox, the
    resolved-config artifact and the command's output hold the bare URI only."""
    data = tmp_path / "results" / "data" / "d0"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text(json.dumps({"data_id": "d0", "num_docs": 3}))
    run = tmp_path / "results" / "base"
    bare = f"http://127.0.0.1:{free_port()}"
    done = run_cli(["track-init", "--run-dir", str(run), "--data", str(data)], cwd=tmp_path,
                   env={"MLFLOW_TRACKING_URI": bare.replace("://", f"://{USER}:{PASSWORD}@")})
    assert done.returncode == 0, done.stdout[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("local:")  # parent kept offline
    assert PASSWORD not in done.stdout and USER not in done.stdout
    layout = RunLayout.at(run)
    assert json.loads(layout.tracking_json.read_text())["tracking_uri"] == bare
    ops = [json.loads(line)["op"] for line in layout.outbox.read_text().splitlines()]
    assert ops[:2] == ["parent", "params"] and "artifact" in ops
    assert _leaks(tmp_path) == []


def test_store_uri_moves_uri_credentials_into_mlflow_variables() -> None:
    os.environ["MLFLOW_TRACKING_URI"] = f"http://{USER}:p%40ss%3Aw@tracker.example:5000/"
    assert resolve_uri(load_config(None)) == "http://tracker.example:5000"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == USER
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "p@ss:w"  # percent-decoded
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://tracker.example:5000"  # for children
    # a SQL store needs its password in the URI: kept for MLflow, redacted when written
    sql = f"postgresql://{USER}:{PASSWORD}@db:5432/mlflow"
    assert store_uri(sql) == sql
    assert redact_uri(sql) == "postgresql://db:5432/mlflow"
    _, creds = split_credentials(sql)
    assert creds is not None and PASSWORD not in repr(creds)


def test_config_dumps_and_hash_hold_no_credentials() -> None:
    with_pw = load_config(None, [f"tracking.uri=http://{USER}:{PASSWORD}@h:5000"])
    bare = load_config(None, ["tracking.uri=http://h:5000"])
    text = config_yaml(with_pw)
    assert PASSWORD not in text and USER not in text
    assert yaml.safe_load(text)["tracking"]["uri"] == "http://h:5000"
    assert public_dict(with_pw)["tracking"]["uri"] == "http://h:5000"
    assert config_hash(with_pw) == config_hash(bare)  # credentials are not config
    assert with_pw.tracking.uri.startswith(f"http://{USER}:")  # the live config keeps them


def test_probe_sends_uri_credentials_as_basic_auth() -> None:
    with AuthServer(USER, PASSWORD) as server:
        assert probe(f"http://{USER}:{PASSWORD}@127.0.0.1:{server.port}") is None
        (path, host, auth), = server.requests
    assert (path, host) == ("/health", f"127.0.0.1:{server.port}")  # no userinfo in the host
    assert auth.startswith("Basic ")


def test_probe_uses_mlflow_credential_variables_and_token() -> None:
    with AuthServer(USER, PASSWORD) as server:
        os.environ["MLFLOW_TRACKING_USERNAME"] = USER
        os.environ["MLFLOW_TRACKING_PASSWORD"] = PASSWORD
        assert probe(f"http://127.0.0.1:{server.port}") is None
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        del os.environ[name]
    with AuthServer(token="tok-123") as server:
        os.environ["MLFLOW_TRACKING_TOKEN"] = "tok-123"
        assert probe(f"http://127.0.0.1:{server.port}") is None
        assert server.requests[0][2] == "Bearer tok-123"


def test_probe_of_refused_credentials_names_the_variables_not_the_password() -> None:
    with AuthServer(USER, PASSWORD) as server:
        bare = f"http://127.0.0.1:{server.port}"
        missing = probe(bare)
        wrong = probe(bare.replace("://", f"://{USER}:wrong-{PASSWORD}@"))
    assert missing == (f"{bare}/health answered HTTP 401: credentials are needed; set "
                       "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD "
                       "(or MLFLOW_TRACKING_TOKEN)")
    assert wrong is not None and "credentials were refused" in wrong
    assert PASSWORD not in wrong and USER not in wrong


def test_errors_quoting_the_uri_leave_the_password_out(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    rc = main(["sync-tracking", "--run-dir", str(tmp_path), "--uri",
               f"file://{USER}:{PASSWORD}@host/mlruns"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == ("error: tracking.uri = 'file://host/mlruns' is a plain file store, which "
                   "MLflow 3 refuses; use sqlite:///results/mlflow.db or http://host:port\n")
    # an override list that fails to parse is quoted back without the password
    rc = main(["pack", "--out", str(tmp_path / "d"), f"tracking.uri=http://{USER}:{PASSWORD}@h",
               "model.loops=[1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: cannot parse overrides ['tracking.uri=http://h'")
    assert PASSWORD not in err and USER not in err


@pytest.mark.slow
def test_mlflow_server_behind_auth_gets_the_runs_and_never_the_password(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A real `mlflow server` behind an authenticating proxy (every path guarded, or all
    but /health as MLflow's basic-auth app does). Without credentials, track-init keeps its
    parent in the outbox and names the variables to set; with them in the URI it creates
    the runs; `sync-tracking` with MLflow's variables delivers the offline run."""
    from mlflow import MlflowClient
    from support.mlflow_server import Server

    server = Server(tmp_path_factory.mktemp("mlflow_behind_auth"))
    data = tmp_path / "results" / "data" / "d0"
    data.mkdir(parents=True)
    (data / "metadata.json").write_text(json.dumps({"data_id": "d0", "num_docs": 3}))

    def track_init(run: str, uri: str) -> list[str]:
        done = run_cli(["track-init", "--run-dir", str(tmp_path / "results" / run),
                        "--data", str(data), f"tracking.uri={uri}"], cwd=tmp_path)
        assert done.returncode == 0 and PASSWORD not in done.stdout, done.stdout[-3000:]
        return done.stdout.strip().splitlines()

    try:
        server.start()
        with AuthServer(USER, PASSWORD, upstream=server.base) as guard, \
                AuthServer(USER, PASSWORD, upstream=server.base, open_health=True) as app:
            for run, proxy in (("anon", guard), ("anon_api", app)):
                out = track_init(run, proxy.base)
                assert out[-1].startswith("local:")  # offline: nothing lost
                assert "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in out[0]
            parent = track_init("base", guard.base.replace("://", f"://{USER}:{PASSWORD}@"))[-1]
            assert not parent.startswith("local:")
            assert not (tmp_path / "results" / "base" / "tracking_outbox.jsonl").exists()
            synced = run_cli(["sync-tracking", "--uri", app.base,
                              "experiment.results_dir=results"], cwd=tmp_path,
                             env={"MLFLOW_TRACKING_USERNAME": USER,
                                  "MLFLOW_TRACKING_PASSWORD": PASSWORD})
            assert synced.returncode == 0, synced.stdout[-3000:]
            assert {p for p, _, _ in guard.requests} >= {"/health"}
            assert all(host == f"127.0.0.1:{guard.port}" for _, host, _ in guard.requests)
        client = MlflowClient(server.base)  # directly, behind the proxies
        exp = client.get_experiment_by_name("loopline-default").experiment_id
        parents = client.search_runs([exp], "tags.`loopline.role` = 'parent'")
        client.download_artifacts(parent, "config", str(tmp_path / "downloaded"))
    finally:
        server.stop()
    assert {p.data.tags["loopline.run"] for p in parents} == {"anon", "anon_api", "base"}
    assert {p.data.params["tracking.uri"] for p in parents} == {guard.base, app.base}
    assert len(list((tmp_path / "downloaded" / "config").glob("config_*.yaml"))) == 1
    assert _leaks(tmp_path) == [] and _leaks(server.root) == []
