"""Run the tiny pipeline once per session in a scratch working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = ROOT / "config" / "experiments" / "tiny.yaml"


def snakemake(workdir: Path, *args: str, extra_configs: tuple[Path, ...] = (),
              timeout: int = 900) -> subprocess.CompletedProcess:
    """``snakemake --snakefile ROOT/Snakefile --directory workdir …`` with the tiny config
    (and ``extra_configs`` merged over it: one --configfile flag takes them all)."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workdir / ".hf"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(TINY), *map(str, extra_configs), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=workdir)


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory in which the whole tiny pipeline has run successfully."""
    workdir = tmp_path_factory.mktemp("pipeline")
    result = snakemake(workdir, "--cores", "2")
    if result.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in (workdir / "logs").rglob("*.log"))
        pytest.fail(f"tiny pipeline failed:\n{result.stderr[-6000:]}\n{logs[-12000:]}")
    return workdir
