"""Snakemake runs of the tiny pipeline, for the workflow tests (imported by name from
``support``, not from a conftest: several test directories have a conftest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
