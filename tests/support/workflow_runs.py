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
              timeout: int = 900, config: Path = TINY,
              snakefile: Path = ROOT / "Snakefile") -> subprocess.CompletedProcess:
    """``snakemake --snakefile ROOT/Snakefile --directory workdir …`` with ``config`` (the
    tiny one by default) and ``extra_configs`` merged over it (one --configfile flag takes
    them all); ``snakefile``: another copy of the workflow."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workdir / ".hf"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [str(SNAKEMAKE), "--snakefile", str(snakefile), "--directory", str(workdir),
           "--configfile", str(config), *map(str, extra_configs), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=workdir)


def job_counts(output: str) -> dict[str, int]:
    """Job counts from the 'Job stats' table Snakemake prints (dry run or real)."""
    lines = output.splitlines()
    if "Job stats:" not in lines:
        return {}
    jobs = {}
    for line in lines[lines.index("Job stats:") + 3:]:
        parts = line.split()
        if len(parts) != 2 or parts[0] == "total":
            break
        jobs[parts[0]] = int(parts[1])
    return jobs
