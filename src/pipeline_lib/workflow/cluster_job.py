"""Snakemake inside a cluster job: no retries there, signals left to the stage, exit 75 for a
stopped segment.

Under the SLURM executor each job runs Snakemake twice inside its allocation (``--mode
remote``: the batch script's, which starts ``srun``, and the job step's, which runs the
rule's script); both read the Snakefile, which calls :func:`enter_cluster_job`. Then:

- **No retry inside the allocation.** A retry is Snakemake's resubmission from the login
  node: a new job with its full wall time. Inside a job, rules are not retried (else a job
  stopped 5 minutes before its limit would retry in the minutes left, up to 3 × 3 times).
- **SIGUSR1 is the stage's.** SLURM sends the job's steps SIGUSR1 ``train.stop_margin_minutes``
  before the time limit (:func:`~pipeline_lib.workflow.cluster_resources.segment_time`); the
  trainer turns it into a stop after the current step. Snakemake would die of it (its default
  action), taking the step down before the resume point is written, so here it is ignored
  (a Python handler, which a child's ``exec`` resets: the script gets its own).
  SIGTERM is already Snakemake's graceful stop: it waits for the running script.
- **A stopped segment exits 75** (:data:`~pipeline_lib.errors.PREEMPTED_EXIT`, EX_TEMPFAIL) at
  every level, as the stage command does, rather than Snakemake's 1: ``sacct`` tells a stop
  from a failure (Snakemake's retry continues it). Stopped means: the job's segment snapshot
  is missing and this attempt wrote its resume point.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import PREEMPTED_EXIT
from ..spec.layout import RunLayout

SEGMENT_RULES = ("train_segment", "train_segment_temp")
_TARGET = re.compile(r"^(?P<rule>\w+):(?P<wildcards>.*)$")


def target_segment(argv: Sequence[str]) -> tuple[str, int] | None:
    """(run, step) of the segment job named by ``--target-jobs`` in a job's Snakemake
    command line, or None for any other job."""
    args = list(argv)
    if "--target-jobs" not in args:
        return None
    i = args.index("--target-jobs") + 1
    match = _TARGET.match(args[i]) if i < len(args) else None
    if match is None or match["rule"] not in SEGMENT_RULES:
        return None
    wildcards = dict(kv.split("=", 1) for kv in match["wildcards"].split(",") if "=" in kv)
    if "run" not in wildcards or not wildcards.get("step", "").isdigit():
        return None
    return wildcards["run"], int(wildcards["step"])


def stopped_since(run_dir: Path, step: int, output: Path, started: float) -> bool:
    """Whether the segment ending at ``step`` stopped in this attempt: no ``output``
    snapshot, and a resume point for it written after ``started`` (a time.time()), not the
    finished segment's files kept in its place (pipeline_lib.train.finished)."""
    state = RunLayout.at(run_dir).resume_point(step) / "trainer_state.json"
    try:
        written = state.stat().st_mtime
        finished = json.loads(state.read_text()).get("step") == step
    except (OSError, ValueError, AttributeError):
        return False
    return not output.exists() and written >= started and not finished


def _ignore(signum: int, frame: Any) -> None:
    """SIGUSR1 in Snakemake's own process: the stage's to act on, not Snakemake's to die of."""


def enter_cluster_job(workflow: Any, plan: Any, argv: Sequence[str] | None = None) -> None:
    """Called by the Snakefile in a job's Snakemake (``workflow.remote_exec``): see the
    module docstring. ``argv``: the job's Snakemake command line (default ``sys.argv``)."""
    started = time.time()
    argv = sys.argv if argv is None else argv
    for rule in workflow.rules:
        rule.restart_times = 0
    signal.signal(signal.SIGUSR1, _ignore)
    segment = target_segment(argv)
    if segment is None:
        return
    run, step = segment
    output = Path(plan.snapshot_path(run, step))

    def exit_75_if_stopped() -> None:
        if stopped_since(Path(plan.run_dir(run)), step, output, started):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(PREEMPTED_EXIT)

    atexit.register(exit_75_if_stopped)
