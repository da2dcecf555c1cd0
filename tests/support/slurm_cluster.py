"""The real one-node SLURM cluster of ``scripts/slurm_local.sh`` for tests/workflow/test_slurm.py
(and the run config and environment that test_slurm_nodes.py shares with it):
bringing it up (or the reason it cannot be), and reading what it did (sacct, squeue)."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
STATE_DIR = Path(os.environ.get("LOOPLINE_SLURM_DIR", "/tmp/loopline-slurm"))
CANNOT = 3  # the script's exit status: no cluster can be brought up on this machine
RUN = "loops2"  # the one run of the SLURM tests' configs


def cluster(action: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), action, *args], capture_output=True,
                          text=True, timeout=timeout)


def was_up(state_dir: Path = STATE_DIR) -> bool:
    """Whether the cluster whose files are in ``state_dir`` runs (its slurmctld)."""
    pid = state_dir / "slurmctld.pid"
    try:
        os.kill(int(pid.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Job:
    """One row of ``sacct`` (an allocation, or a step: ``id`` like ``12.0``)."""

    id: str
    name: str
    partition: str
    account: str
    cpus: int
    req_mem: str
    timelimit: str
    state: str
    exit_code: str


FIELDS = "JobID,JobName%60,Partition,Account,AllocCPUS,ReqMem,Timelimit,State,ExitCode"


def sacct(*args: str) -> list[Job]:
    out = subprocess.run(["sacct", "-n", "-P", "-o", FIELDS, *args], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    jobs = []
    for line in out.splitlines():
        f = line.split("|")
        if len(f) == 9:
            jobs.append(Job(f[0], f[1], f[2], f[3], int(f[4] or 0), f[5], f[6],
                            f[7].split()[0], f[8]))
    return jobs


def jobs_named(prefix: str, *args: str) -> list[Job]:
    """This test's allocations (job names ``{prefix}_{uuid}``), every requeued instance
    too (``sacct -D``)."""
    return [j for j in sacct("-X", "-D", "-S", "now-2hours", *args)
            if j.name.startswith(prefix + "_")]


def running_job(comment_part: str) -> str | None:
    """The id of the RUNNING job whose comment (the plugin's ``rule_…_wildcards_…``)
    contains ``comment_part``."""
    out = subprocess.run(["squeue", "-h", "-t", "RUNNING", "-o", "%i|%k"], capture_output=True,
                         text=True, timeout=60).stdout
    for line in out.splitlines():
        job, _, comment = line.partition("|")
        if comment_part in comment:
            return job.strip()
    return None


def job_state(job: str) -> str:
    """The job's squeue state ('' once SLURM no longer lists it)."""
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                          text=True, timeout=60).stdout.strip()


def wait_gone(job: str, timeout: float = 300) -> None:
    """Until SLURM no longer lists ``job`` as pending or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not job_state(job):
            return
        time.sleep(1)
    raise AssertionError(f"SLURM job {job} still listed after {timeout} s")


def run_config(steps: int, segment: int, train_extra: str = "") -> str:
    """The config of the SLURM tests' run ``RUN``: ``steps`` in segments of ``segment``,
    ``train_extra`` lines added to its train section."""
    return f"""
experiment: {{name: loopline-slurm}}
data:
  sources:
    - {{type: reasoning, num_docs: 300, max_difficulty: 2}}
train:
  total_steps: {steps}
  steps_per_segment: {segment}
  micro_batch_rows: 1  # eight passes per step
  eval_interval: {segment}{train_extra}
  eval_rows: 16
snapshots: {{keep_last: 2}}
eval: {{h_eff: [1, 2], max_tokens: 512}}
bench: {{tasks: [loopline_khop], h_eff: [1, 2], examples_per_level: 2, max_difficulty: 2}}
resources: {{slurm_partition: train, slurm_account: loopline, train_mem_mb: 3500,
             eval_mem_mb: 3000, eval_runtime_minutes: 20}}
runs:
  {RUN}: {{model: {{loops: 2}}}}
"""


def job_env(workdir: Path) -> dict[str, str]:
    """The environment of a test's Snakemake: offline, one thread, no outside tracking."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workdir / ".hf"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env
