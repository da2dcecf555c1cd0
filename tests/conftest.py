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


def _shared_groups(item: pytest.Item) -> set[str]:
    """The groups of the shared session fixtures ``item`` uses (by the fixture it gets, not
    by name alone: another directory may define a fixture of the same name)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    return {SHARED_FIXTURE_GROUPS[name] for name, found in defs.items()
            if name in SHARED_FIXTURE_GROUPS and found and found[-1].scope == "session"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups into node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """An ``xdist_group`` per test (see :data:`SHARED_FIXTURE_GROUPS`), and the groups that
    hold a slow test first, so the longest work starts first on a worker rather than last
    (the order of the others, and within every group, is kept). Without xdist the marker does
    nothing."""
    groups: dict[str, str] = {}
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None:
            shared = sorted(_shared_groups(item))
            decorator = pytest.mark.xdist_group(shared[0] if shared else
                                                item.nodeid.split("::")[0])
            item.add_marker(decorator)
            marker = decorator.mark
        groups[item.nodeid] = str(marker.args[0] if marker.args else marker.kwargs["name"])
    slow = {groups[i.nodeid] for i in items if i.get_closest_marker("slow")}
    items.sort(key=lambda i: groups[i.nodeid] not in slow)


@pytest.fixture
def project_root() -> Path:
    return PROJECT_ROOT
