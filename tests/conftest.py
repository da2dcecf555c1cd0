"""Shared test set-up: one torch thread (2-core machines, determinism), project paths, and
the order of test files for parallel workers (``make test`` runs ``pytest -n 2 --dist
loadfile``: pytest-xdist; ``loadgroup`` does not group under pytest 9, whose node ids no
longer take xdist's group suffix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Where the slow files are whole Snakemake pipelines (minutes each): these start first.
WHOLE_PIPELINE_DIRS = ("tests/workflow/", "tests/reliability/")


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files that hold a slow test first, those of whole Snakemake pipelines before the others,
    so that under ``--dist loadfile`` (a file's tests on one worker: its module and session
    fixtures built once) the longest work starts first rather than last. Files stay whole
    and in order otherwise."""
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow = {file_of(i) for i in items if i.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[bool, int]:
        path = file_of(item)
        where = next((k for k, d in enumerate(WHOLE_PIPELINE_DIRS) if path.startswith(d)),
                     len(WHOLE_PIPELINE_DIRS))
        return path not in slow, where

    items.sort(key=rank)


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT
