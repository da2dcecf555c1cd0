"""A run's training lease: one segment job at a time trains a run.

A Snakemake killed with ``kill -9`` (a lost login session) leaves its SLURM jobs running;
the same command run again does not know them and submits the missing segment again. Two
jobs would then train the same segment at once, write the same snapshot and log every
metric twice. So before a segment trains, its job takes ``{run}/train/lease.json`` (created
with O_EXCL), naming itself: the SLURM job id when there is one (``SLURM_JOB_ID``), and its
process id and host. A lease whose holder still runs refuses the new job in one line telling
what to ``scancel`` (or ``kill``); one whose holder is gone (a killed job, a crash) is taken
over. A requeued SLURM job keeps its id: its own old lease is its to take. The lease goes
when the job ends, stopped, failed or done.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..checkpoint.fsutil import pid_alive
from ..errors import TrainingError
from ..spec.layout import RunLayout

log = logging.getLogger(__name__)

# squeue states of a job that still holds (or will again hold) its allocation
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                         "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                         "STAGE_OUT", "STOPPED"})


def _me(until_step: int) -> dict[str, Any]:
    return {"slurm_job_id": os.environ.get("SLURM_JOB_ID") or None, "pid": os.getpid(),
            "host": socket.gethostname(), "until_step": until_step,
            "since": time.strftime("%Y-%m-%d %H:%M:%S")}


def _slurm_job_state(job_id: str) -> str | None:
    """The job's squeue state, or None when SLURM no longer knows it (or squeue fails)."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    state = out.stdout.strip().split("\n")[0].strip() if out.returncode == 0 else ""
    return state or None


def holder_alive(lease: dict[str, Any]) -> bool:
    """Whether the lease's holder still runs (as far as this machine can tell)."""
    job = lease.get("slurm_job_id")
    if job:
        if job == os.environ.get("SLURM_JOB_ID"):
            return False  # this very job, requeued: its own old lease
        return _slurm_job_state(str(job)) in LIVE_STATES
    if lease.get("host") != socket.gethostname():
        return True  # another machine's process: nothing here can tell; assume it runs
    return pid_alive(int(lease.get("pid", -1)))


def _holder(lease: dict[str, Any]) -> tuple[str, str]:
    """(who holds the lease, the command that stops it)."""
    if lease.get("slurm_job_id"):
        return f"SLURM job {lease['slurm_job_id']}", f"scancel {lease['slurm_job_id']}"
    return (f"process {lease.get('pid')} on {lease.get('host')}",
            f"kill {lease.get('pid')} (on {lease.get('host')})")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


@contextlib.contextmanager
def run_lease(run_dir: Path, until_step: int) -> Iterator[dict[str, Any]]:
    """Hold ``run_dir``'s training lease while the block runs (see the module docstring);
    a live holder raises :class:`TrainingError` naming it and the command that stops it."""
    path = RunLayout.at(Path(run_dir)).lease
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = _me(until_step)
    text = json.dumps(mine, indent=2) + "\n"
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            other = _read(path)
            if other is not None and holder_alive(other):
                who, stop = _holder(other)
                raise TrainingError(
                    f"run {Path(run_dir).name} is being trained by {who} (segment to step "
                    f"{other.get('until_step')}, since {other.get('since')}; lease {path}): "
                    f"a second job must not train it at once. Wait for it to finish, or stop "
                    f"it with `{stop}`, then rerun") from None
            log.warning("taking over %s: its holder is gone (%s)", path, other)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            continue
        with os.fdopen(fd, "w") as f:
            f.write(text)
        break
    else:  # pragma: no cover - three races in a row
        raise TrainingError(f"cannot take the training lease {path}: other jobs keep taking "
                            "it; check for concurrent Snakemake runs of this directory")
    try:
        yield mine
    finally:
        if _read(path) == mine:
            path.unlink(missing_ok=True)
        for folder in made:  # a job that wrote nothing else leaves nothing behind
            with contextlib.suppress(OSError):
                folder.rmdir()


__all__ = ["holder_alive", "run_lease"]
