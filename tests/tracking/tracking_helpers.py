"""Helpers shared by the tracking tests: configs, clients, free ports, metric counts."""

from __future__ import annotations

import socket
from typing import Any

from pipeline_lib.spec.config import Config, ExperimentConfig, TrackingConfig


def make_config(uri: str, experiment: str = "loopline-test", **tracking: Any) -> Config:
    """Default config whose tracking goes to ``uri`` (experiment names limited to 60 chars)."""
    return Config(tracking=TrackingConfig(uri=uri, **tracking),
                  experiment=ExperimentConfig(name=experiment[:60]))


def client(uri: str) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(uri)


def free_port() -> int:
    """A loopback port nobody listens on (bound then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def steps_of(uri: str, run_id: str, key: str) -> list[int]:
    """Every stored step of a metric, sorted (duplicates kept: they are what we count)."""
    return sorted(m.step for m in client(uri).get_metric_history(run_id, key))


def children(uri: str, experiment_id: str, parent_id: str) -> list[Any]:
    return client(uri).search_runs(
        [experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_id}'")
