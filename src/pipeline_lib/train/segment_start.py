"""How a segment starts, decided once: :func:`segment_start` → :class:`SegmentStart`.

A segment job has one input (the previous snapshot, or none) and may begin in five ways:

* **scratch**: no input; a freshly seeded model at step 0;
* **resume**: the input snapshot, exactly (weights, optimizer, cursor, RNG, guard);
* **resume point**: a stopped attempt of this very job left ``train/resume/step_{until}``
  (same input, same end step, same train signature): continue from there, not from the input;
* **rollback**: a retry (attempt > 1) whose input and signature are the ones a spike-guard
  abort recorded in ``train/rollback.json``: resume it and jump the data cursor past the bad
  window;
* **warm start**: no input but another snapshot's weights only (the imported ``init/`` of a
  ``model.init_from`` run, or ``--warm-start``), everything else fresh at step 0.

The job's inputs (input snapshot, warm-start snapshot, attempt number from the per-attempt
log, not a Snakemake resource) go in; the trainer restores from the one value that comes out.

What a retry applies (a resume point, a rollback record) carries the *train signature* it was
made under (:func:`job_signature`: what determines the weights, the segment rule's
``params.signature``). Another signature means the config changed between the attempts
(``train.lr``, the seed, …): the state was made under other values than the config says, so
it is never continued; the segment starts from its input instead.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..spec.config import Config
from ..spec.data_id import data_id
from ..spec.layout import RunLayout
from ..spec.names import PACK_METADATA
from ..spec.signatures import train_signature
from . import rollback

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentStart:
    """Where one segment job begins (see the module docstring for the five kinds)."""

    input: Path | None  # the job's input snapshot (its last good one); None: none
    until_step: int  # the step the segment ends at
    attempt: int  # 1 for a first try; > 1 for a retry
    signature: str  # the job's train signature (:func:`job_signature`)
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


def job_signature(cfg: Config, data_dir: Path) -> str:
    """The train signature of a segment job: :func:`~pipeline_lib.spec.signatures.
    train_signature` of its completed config and the data id of the pack it trains on (the
    pack's ``metadata.json``; the config's own when the pack has none). Under Snakemake this
    is the rule's ``params.signature``; the ``train`` command computes it the same way."""
    try:
        pack_id = str(json.loads((Path(data_dir) / PACK_METADATA).read_text())["data_id"])
    except (OSError, ValueError, KeyError, TypeError):  # the trainer names a broken pack
        pack_id = data_id(cfg.data)
    return train_signature(cfg, pack_id)


def stop_record(path: Path) -> dict[str, Any] | None:
    """The last stop record of the resume point at ``path`` (None: none, or unreadable)."""
    try:
        record = json.loads((path / "trainer_state.json").read_text())["preemptions"][-1]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    return record if isinstance(record, dict) else None


def _same_job(record: dict[str, Any] | None, resume_from: Path | None, until_step: int) -> bool:
    try:
        return (record is not None
                and record["input"] == (None if resume_from is None else str(resume_from))
                and int(record["until_step"]) == until_step)
    except (KeyError, ValueError, TypeError):
        return False


def usable_resume_point(path: Path, resume_from: Path | None, until_step: int,
                        signature: str) -> dict[str, Any] | None:
    """The stop record of the resume point at ``path`` when it was left by an attempt of
    this very job (same input snapshot, same end step) under the same train ``signature``;
    else None, and the stale point is removed: it can never be continued (another job, or a
    config changed since), and its path is this job's own resume point."""
    if not path.exists():
        return None
    record = stop_record(path)
    if _same_job(record, resume_from, until_step):
        if record.get("signature") == signature:
            return record
        log.warning("resume point %s was made under train signature %s, this job's is %s (the "
                    "config changed since it stopped): not continued, removed; the segment "
                    "starts from %s", path, record.get("signature", "(none recorded)"),
                    signature, resume_from or "scratch")
    else:
        log.warning("removing %s: it is not a resume point of this job (input %s, until step "
                    "%d)", path, resume_from, until_step)
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
                  signature: str, attempt: int = 1,
                  warm_start: Path | None = None) -> SegmentStart:
    """The one decision of how the segment to ``until_step`` begins under the train
    ``signature`` (a stale resume point, of another job or another signature, is removed
    here)."""
    check_start_inputs(input_snapshot, warm_start)
    point = RunLayout.at(run_dir).resume_point(until_step)
    stopped = usable_resume_point(point, input_snapshot, until_step, signature)
    start = SegmentStart(input=input_snapshot, until_step=until_step, attempt=attempt,
                         signature=signature, point=point, stopped=stopped,
                         warm_start=warm_start if stopped is None else None)
    if stopped is not None or attempt < 2:
        return start
    input_step = 0 if input_snapshot is None else _snapshot_step(input_snapshot)
    record = (None if input_step is None
              else rollback.matching_record(run_dir, input_snapshot, input_step, signature))
    if record is None:
        return start
    return SegmentStart(input=input_snapshot, until_step=until_step, attempt=attempt,
                        signature=signature, point=point, warm_start=warm_start,
                        rollback={**record, "applied_attempt": attempt})


__all__ = ["SegmentStart", "check_start_inputs", "job_signature", "segment_start",
           "stop_record", "usable_resume_point"]
