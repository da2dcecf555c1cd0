"""How a segment starts, decided once: :func:`segment_start` → :class:`SegmentStart`.

A segment job has one input (the previous snapshot, or none) and may begin in five ways:

* **scratch**: no input; a freshly seeded model at step 0;
* **resume**: the input snapshot, exactly (weights, optimizer, cursor, RNG, guard);
* **resume point**: a stopped attempt of this very job left ``train/resume/step_{until}``
  (same input, same end step): continue from there, not from the input;
* **rollback**: a retry (attempt > 1) whose input is the one a spike-guard abort recorded in
  ``train/rollback.json``: resume it and jump the data cursor past the bad window;
* **warm start**: no input but another snapshot's weights only (the imported ``init/`` of a
  ``model.init_from`` run, or ``--warm-start``), everything else fresh at step 0.

The job's inputs (input snapshot, warm-start snapshot, attempt number from the per-attempt
log, not a Snakemake resource) go in; the trainer restores from the one value that comes out.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..spec.layout import RunLayout
from . import rollback

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentStart:
    """Where one segment job begins (see the module docstring for the five kinds)."""

    input: Path | None  # the job's input snapshot (its last good one); None: none
    until_step: int  # the step the segment ends at
    attempt: int  # 1 for a first try; > 1 for a retry
    point: Path  # this job's resume point (written on a stop, removed at the end)
    stopped: dict[str, Any] | None = None  # the stop record when continuing from ``point``
    warm_start: Path | None = None  # weights-only start (never with ``input``)
    rollback: dict[str, Any] | None = None  # the record this retry rolls back by

    @property
    def kind(self) -> str:
        if self.stopped is not None:
            return "resume point"
        if self.rollback is not None:
            return "rollback"
        if self.input is not None:
            return "resume"
        return "warm start" if self.warm_start is not None else "scratch"

    @property
    def load(self) -> Path | None:
        """The snapshot whose state is restored (None: a fresh one)."""
        return self.point if self.stopped is not None else self.input


def usable_resume_point(path: Path, resume_from: Path | None,
                        until_step: int) -> dict[str, Any] | None:
    """The stop record of the resume point at ``path`` when it was left by an attempt of
    this very job (same input snapshot, same end step); else None (and a stale one is
    removed)."""
    if not path.exists():
        return None
    try:
        record = json.loads((path / "trainer_state.json").read_text())["preemptions"][-1]
        same = (record["input"] == (None if resume_from is None else str(resume_from))
                and int(record["until_step"]) == until_step)
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        same = False
    if same:
        return record
    log.warning("removing %s: it is not a resume point of this job (input %s, until step %d)",
                path, resume_from, until_step)
    shutil.rmtree(path, ignore_errors=True)
    return None


def _snapshot_step(snapshot: Path) -> int | None:
    """The step ``snapshot`` recorded (None when unreadable: restoring it names the fault)."""
    try:
        return int(json.loads((snapshot / "trainer_state.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_start_inputs(input_snapshot: Path | None, warm_start: Path | None) -> None:
    """A job resumes or warm-starts, never both (checked before anything is touched)."""
    if warm_start is not None and input_snapshot is not None:
        raise ConfigError("--warm-start and --resume-from exclude each other: resume "
                          "continues a run exactly, a warm start begins a new one")


def segment_start(run_dir: Path, input_snapshot: Path | None, until_step: int, *,
                  attempt: int = 1, warm_start: Path | None = None) -> SegmentStart:
    """The one decision of how the segment to ``until_step`` begins (a stale resume point
    of another job is removed here)."""
    check_start_inputs(input_snapshot, warm_start)
    point = RunLayout.at(run_dir).resume_point(until_step)
    stopped = usable_resume_point(point, input_snapshot, until_step)
    start = SegmentStart(input=input_snapshot, until_step=until_step, attempt=attempt,
                         point=point, stopped=stopped,
                         warm_start=warm_start if stopped is None else None)
    if stopped is not None or attempt < 2:
        return start
    input_step = 0 if input_snapshot is None else _snapshot_step(input_snapshot)
    record = (None if input_step is None
              else rollback.matching_record(run_dir, input_snapshot, input_step))
    if record is None:
        return start
    return SegmentStart(input=input_snapshot, until_step=until_step, attempt=attempt,
                        point=point, warm_start=warm_start,
                        rollback={**record, "applied_attempt": attempt})


__all__ = ["SegmentStart", "check_start_inputs", "segment_start", "usable_resume_point"]
