"""A run's training lease: one segment job at a time trains a run; a second one waits.

A Snakemake killed with ``kill -9`` (a lost login session) leaves its segment job running;
the same command run again does not know it and starts the segment again. Two jobs would
then train the same run at once, write the same snapshot and log every metric twice. So
before a segment trains, its job takes ``{run}/train/lease.json``
(:class:`~pipeline_lib.holders.HolderFile`: created or taken over atomically), naming itself
(its SLURM job id when there is one, its host, pid and process start time) and what it
trains (input snapshot, end step, train signature, output).

A second job finding the lease held:

* by a holder that still runs (a SLURM job that ``squeue`` lists as pending, running or
  suspended; a process on this host with the recorded start time): **waits** for it to end,
  saying once a minute whom it waits for and how to stop that one, then takes the lease.
  The launcher then adopts what the holder finished (:func:`.segment_start.adopt_finished`)
  or continues from its resume point, rather than training the segment again;
* by a holder that is gone (a killed job, a crash, a pid now used by another process, this
  very SLURM job requeued: SLURM keeps its id): takes the lease over;
* by a holder nothing here can check (a process on another host, or ``squeue`` not
  answering): refuses in one line naming it, the command that stops it, and the way out if
  it is gone (delete the lease file).

A stop signal while waiting (SIGTERM, SIGUSR1) ends the wait with one line. The lease goes
when the job ends, stopped, failed or done.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..errors import TrainingError
from ..holders import ALIVE, GONE, UNKNOWN, HolderFile, process_state, this_process
from ..spec.layout import RunLayout
from .preempt import latched_signal

log = logging.getLogger(__name__)

# squeue states of a job that still holds (or will again hold) its allocation
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                         "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
                         "STAGE_OUT", "STOPPED"})
POLL_S = {"process": 1.0, "slurm": 30.0}  # how often a waiting job looks again
SAY_EVERY_S = 60.0  # how often it says whom it waits for


class _Held(Exception):
    """The lease is held by ``holder`` (:data:`ALIVE` or :data:`UNKNOWN`)."""

    def __init__(self, holder: dict[str, Any], state: str) -> None:
        super().__init__(state)
        self.holder, self.state = holder, state


def slurm_job_state(job_id: str) -> str | None:
    """:data:`ALIVE` or :data:`GONE` as ``squeue`` tells; None when it cannot tell."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return GONE if "invalid job id" in out.stderr.lower() else None
    state = out.stdout.strip().split("\n")[0].strip()
    return ALIVE if state in LIVE_STATES else GONE


def holder_state(lease: Mapping[str, Any]) -> str:
    """Whether the lease's holder still runs: :data:`ALIVE`, :data:`GONE` or
    :data:`UNKNOWN` (as far as this machine can tell)."""
    job = lease.get("slurm_job_id")
    if job:
        if job == os.environ.get("SLURM_JOB_ID"):
            return GONE  # this very job, requeued: its own old lease
        state = slurm_job_state(str(job))
        if state is not None:
            return state
    return process_state(lease)


def _holder(lease: Mapping[str, Any]) -> tuple[str, str]:
    """(who holds the lease, the command that stops it)."""
    if lease.get("slurm_job_id"):
        return f"SLURM job {lease['slurm_job_id']}", f"scancel {lease['slurm_job_id']}"
    return (f"process {lease.get('pid')} on {lease.get('host')}",
            f"kill {lease.get('pid')} (on {lease.get('host')})")


def _what(lease: Mapping[str, Any], path: Path) -> str:
    return (f"segment to step {lease.get('until_step')}, since {lease.get('since')}; "
            f"lease {path}")


def _claim(lease: dict[str, Any] | None, mine: dict[str, Any], path: Path) -> dict[str, Any]:
    """The record to put in place of ``lease``: mine, unless its holder may still run."""
    if lease is None:
        return mine
    state = holder_state(lease)
    if state != GONE:
        raise _Held(lease, state)
    log.warning("taking over %s: its holder is gone (%s)", path, lease)
    return mine


def _refusal(run: str, held: _Held, path: Path) -> TrainingError:
    who, stop = _holder(held.holder)
    return TrainingError(
        f"run {run} is being trained by {who} ({_what(held.holder, path)}), which cannot be "
        f"checked from {socket.gethostname()}: if it still runs, wait for it to finish or stop "
        f"it with `{stop}`, then rerun; if it is gone (its host is down, the job was "
        f"killed), delete {path} and rerun")


def _take(lock: HolderFile, mine: dict[str, Any], run: str) -> None:
    """Take the lease, waiting while a live holder has it (see the module docstring)."""
    said = None
    while True:
        try:
            lock.change(lambda lease: _claim(lease, mine, lock.path))
            return
        except _Held as held:
            if held.state == UNKNOWN:
                raise _refusal(run, held, lock.path) from None
            who, stop = _holder(held.holder)
            if latched_signal() is not None:
                raise TrainingError(f"stopped while waiting for {who}, which trains run {run} "
                                    f"({_what(held.holder, lock.path)}); rerun the job once it "
                                    "has ended") from None
            if said is None or time.monotonic() - said >= SAY_EVERY_S:
                log.warning("run %s is being trained by %s (%s): waiting for it to end, then "
                            "this job takes over what it finished; to stop it instead: `%s`",
                            run, who, _what(held.holder, lock.path), stop)
                said = time.monotonic()
            time.sleep(POLL_S["slurm" if held.holder.get("slurm_job_id") else "process"])


@contextlib.contextmanager
def run_lease(run_dir: Path, until_step: int,
              segment: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Hold ``run_dir``'s training lease while the block runs (see the module docstring);
    ``segment``: what the job trains, recorded in the lease (input, signature, output)."""
    path = RunLayout.at(Path(run_dir).absolute()).lease
    made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    mine = {"slurm_job_id": os.environ.get("SLURM_JOB_ID") or None, **this_process(),
            "until_step": until_step, **(segment or {})}
    lock = HolderFile(path, "training lease", TrainingError)
    try:
        _take(lock, mine, Path(run_dir).name)
    except BaseException:
        _remove_made(made)
        raise
    try:
        yield mine
    finally:
        try:
            lock.change(lambda lease: None if lease == mine else lease)
        except TrainingError as exc:  # best effort: a lease left behind is taken over later
            log.warning("could not release the training lease: %s", exc)
        _remove_made(made)


def _remove_made(made: list[Path]) -> None:
    """A job that wrote nothing else leaves no folder behind."""
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()


__all__ = ["holder_state", "run_lease", "slurm_job_state"]
