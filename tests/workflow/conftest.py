"""Run the tiny pipeline once per session in a scratch working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.workflow_runs import snakemake


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory in which the whole tiny pipeline has run successfully."""
    workdir = tmp_path_factory.mktemp("pipeline")
    result = snakemake(workdir, "--cores", "2")
    if result.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in (workdir / "logs").rglob("*.log"))
        pytest.fail(f"tiny pipeline failed:\n{result.stderr[-6000:]}\n{logs[-12000:]}")
    return workdir
