"""Store URIs, reachability probe, failure classification and retries, schema creation."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, TEMPORARILY_UNAVAILABLE
from tracking_helpers import client, free_port, make_config

from pipeline_lib.errors import TrackingError
from pipeline_lib.tracking import store
from pipeline_lib.tracking.store import (
    StoreUnavailable,
    call,
    ensure_store,
    is_transient,
    normalize_uri,
    probe,
    resolve_uri,
)


def test_relative_sqlite_path_resolves_against_cwd(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert normalize_uri("sqlite:///results/mlflow.db") == f"sqlite:///{tmp_path}/results/mlflow.db"
    assert normalize_uri("sqlite:////abs/x.db") == "sqlite:////abs/x.db"
    assert normalize_uri("http://host:5000/") == "http://host:5000"


@pytest.mark.parametrize("uri", ["./mlruns", "file:///tmp/mlruns", "sqlite://", "sqlite:///:memory:"])
def test_unusable_stores_are_refused_with_a_fix(uri: str) -> None:
    with pytest.raises(TrackingError, match="sqlite:///results/mlflow.db"):
        normalize_uri(uri)


def test_env_var_overrides_config(monkeypatch, tmp_path: Path) -> None:
    cfg = make_config("sqlite:////from/config.db")
    assert resolve_uri(cfg) == "sqlite:////from/config.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5999")
    assert resolve_uri(cfg) == "http://127.0.0.1:5999"


def test_probe_reports_a_closed_port_and_accepts_a_sqlite_dir(tmp_path: Path) -> None:
    reason = probe(f"http://127.0.0.1:{free_port()}")
    assert reason is not None and "refused" in reason.lower()
    assert probe(normalize_uri(f"sqlite:///{tmp_path}/new/dir/m.db")) is None
    assert (tmp_path / "new" / "dir").is_dir()


def test_transient_failures_are_told_apart_from_rejections() -> None:
    from mlflow.exceptions import MlflowException

    assert is_transient(MlflowException("(sqlite3.OperationalError) database is locked"))
    assert is_transient(MlflowException("x", error_code=TEMPORARILY_UNAVAILABLE))
    assert is_transient(MlflowException("API request to http://h/api failed with exception "
                                        "HTTPConnectionPool: Max retries exceeded"))
    assert is_transient(ConnectionRefusedError(111, "refused"))
    assert not is_transient(MlflowException("bad key", error_code=INVALID_PARAMETER_VALUE))
    assert not is_transient(FileNotFoundError("artifact.txt"))


def test_call_retries_locked_database_then_succeeds(monkeypatch) -> None:
    from mlflow.exceptions import MlflowException

    monkeypatch.setattr(store, "RETRY_FIRST_DELAY_S", 0.001)
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise MlflowException("(sqlite3.OperationalError) database is locked")
        return "ok"

    assert call(flaky) == "ok"
    assert len(attempts) == 3


def test_call_gives_up_as_store_unavailable(monkeypatch) -> None:
    from mlflow.exceptions import MlflowException

    monkeypatch.setattr(store, "RETRY_FIRST_DELAY_S", 0.001)
    attempts = []

    def locked() -> None:
        attempts.append(1)
        raise MlflowException("database is locked", error_code=TEMPORARILY_UNAVAILABLE)

    with pytest.raises(StoreUnavailable, match="database is locked"):
        call(locked, what="log metrics")
    assert len(attempts) == store.RETRY_ATTEMPTS

    def rejected() -> None:
        raise MlflowException("bad", error_code=INVALID_PARAMETER_VALUE)

    with pytest.raises(MlflowException, match="bad"):
        call(rejected)


def test_ensure_store_creates_schema_and_experiment_once(tmp_path: Path) -> None:
    uri = normalize_uri(f"sqlite:///{tmp_path}/fresh/mlflow.db")
    first = ensure_store(uri, "exp-a")
    assert ensure_store(uri, "exp-a") == first
    assert ensure_store(uri, "exp-b") != first
    exp = client(uri).get_experiment(first)
    assert exp.name == "exp-a"
    # artifacts live next to the database, not in ./mlruns of whoever ran first
    assert exp.artifact_location == (tmp_path / "fresh" / "mlartifacts" / "exp-a").as_uri()


def test_deleted_experiment_is_refused_with_a_fix(store_uri: str) -> None:
    exp_id = ensure_store(store_uri, "gone")
    client(store_uri).delete_experiment(exp_id)
    with pytest.raises(TrackingError, match="mlflow experiments restore"):
        ensure_store(store_uri, "gone")


def test_unreachable_server_raises_store_unavailable_fast() -> None:
    with pytest.raises(StoreUnavailable, match="refused"):
        ensure_store(f"http://127.0.0.1:{free_port()}", "x")
