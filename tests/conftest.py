"""Shared test set-up: one torch thread (2-core machines, determinism), project paths, and
the grouping of tests for parallel workers (``make test`` runs ``pytest -n 2 --dist
loadgroup``: pytest-xdist)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Session fixtures worth building once: every test that uses one of a group runs on the same
# worker. Any other test stays with the rest of its file (module fixtures are built once too).
SHARED_FIXTURE_GROUPS = {
    "tiny_pipeline": "tiny_pipeline",  # the whole tiny Snakemake pipeline (tests/workflow)
    "bench_report": "bench_model", "snapshot_dir": "bench_model",  # tests/bench: a trained
    "trained_model": "bench_model",  # tiny model, its snapshot and a benchmark run of it
}


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An ``xdist_group`` per test (see :data:`SHARED_FIXTURE_GROUPS`); without xdist the
    marker does nothing."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        used = getattr(item, "fixturenames", ())
        shared = sorted({g for f, g in SHARED_FIXTURE_GROUPS.items() if f in used})
        group = shared[0] if shared else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT
