"""Shared test set-up: one torch thread (2-core machines, determinism), project paths, and
how test files are shared out to parallel workers (``make test`` runs ``pytest -n 2 --dist
loadfile --no-loadscope-reorder``: pytest-xdist; ``loadgroup`` does not group under pytest
9, whose node ids no longer take xdist's group suffix)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.scheduling import SHARED_FIXTURE_UNITS, WHOLE_PIPELINE_DIRS

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency
        return
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest work first, so that under ``--dist loadfile`` (a file's tests on one
    worker: its module and session fixtures built once) it does not start last with the
    other worker idle: the SLURM module (minutes spent waiting on a real scheduler), then
    files that hold a slow test, those of whole Snakemake pipelines before the others.
    Files stay whole and in order otherwise. xdist would reorder the files by test count
    (its default ``--loadscope-reorder``): ``make test`` passes ``--no-loadscope-reorder``."""
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slurm = {file_of(i) for i in items if i.get_closest_marker("slurm")}
    slow = {file_of(i) for i in items if i.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> tuple[bool, bool, int]:
        path = file_of(item)
        where = next((k for k, d in enumerate(WHOLE_PIPELINE_DIRS) if path.startswith(d)),
                     len(WHOLE_PIPELINE_DIRS))
        return path not in slurm, path not in slow, where

    items.sort(key=rank)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadfile`` with the files of :data:`SHARED_FIXTURE_UNITS` as one unit."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # only under xdist, on its controller

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_FIXTURE_UNITS.get(path, path)

    return SharedFixtureScheduling(config, log)


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT
