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


def workflow_env(workdir: Path, **extra: str) -> dict[str, str]:
    """The environment of a test's Snakemake: offline, one thread, no outside MLflow."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workdir / ".hf"), "OMP_NUM_THREADS": "1", **extra}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def snakemake_command(workdir: Path, *args: str, extra_configs: tuple[Path, ...] = (),
                      config: Path = TINY, snakefile: Path = ROOT / "Snakefile") -> list[str]:
    return [str(SNAKEMAKE), "--snakefile", str(snakefile), "--directory", str(workdir),
            "--configfile", str(config), *map(str, extra_configs), *args]


def snakemake(workdir: Path, *args: str, extra_configs: tuple[Path, ...] = (),
              timeout: int = 900, config: Path = TINY,
              snakefile: Path = ROOT / "Snakefile") -> subprocess.CompletedProcess:
    """``snakemake --snakefile ROOT/Snakefile --directory workdir …`` with ``config`` (the
    tiny one by default) and ``extra_configs`` merged over it (one --configfile flag takes
    them all); ``snakefile``: another copy of the workflow."""
    cmd = snakemake_command(workdir, *args, extra_configs=extra_configs, config=config,
                            snakefile=snakefile)
    return subprocess.run(cmd, capture_output=True, text=True, env=workflow_env(workdir),
                          timeout=timeout, cwd=workdir)


def start_snakemake(workdir: Path, *args: str, extra_configs: tuple[Path, ...] = (),
                    env: dict[str, str] | None = None) -> subprocess.Popen:
    """:func:`snakemake` in the background, in a session of its own (a signal to it reaches
    no one else), its output in ``workdir/snakemake.<n>.log``."""
    log = workdir / f"snakemake.{len(list(workdir.glob('snakemake.*.log')))}.log"
    with open(log, "w") as out:
        return subprocess.Popen(snakemake_command(workdir, *args, extra_configs=extra_configs),
                                stdout=out, stderr=subprocess.STDOUT, cwd=workdir,
                                env=env or workflow_env(workdir), start_new_session=True)


def segment_pids(workdir: Path) -> list[int]:
    """The python processes running ``workdir``'s train_segment script (not Snakemake's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if proc.name.isdigit() and "train_segment" in cmd and "snakemake\0" not in cmd \
                and cwd == str(workdir) and "python" in cmd:
            pids.append(int(proc.name))
    return pids


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
