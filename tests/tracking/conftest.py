"""Fixtures for the tracking tests: fresh SQLite stores (copied from one migrated template,
since migrating an empty database costs seconds), configs, free ports."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tracking_helpers import make_config

from pipeline_lib.spec.config import Config
from pipeline_lib.tracking.store import normalize_uri


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLFLOW_TRACKING_URI would override every test's store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="session")
def store_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite store with MLflow's schema, migrated once per session."""
    from mlflow import MlflowClient

    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    assert MlflowClient(f"sqlite:///{db}").get_experiment_by_name("none") is None
    return db


@pytest.fixture
def store_uri(tmp_path: Path, store_template: Path) -> str:
    """A fresh, migrated SQLite store of this test: results/mlflow.db under tmp_path."""
    db = tmp_path / "results" / "mlflow.db"
    db.parent.mkdir(parents=True)
    shutil.copy(store_template, db)
    return normalize_uri(f"sqlite:///{db}")


@pytest.fixture
def cfg(store_uri: str, request: pytest.FixtureRequest) -> Config:
    """Default config tracking into this test's store, in an experiment named after it."""
    return make_config(store_uri, request.node.name)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    return tmp_path / "results" / "base"
