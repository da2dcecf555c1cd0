"""How a segment starts, decided once: :func:`segment_start` → :class:`SegmentStart`.

A segment job has one input (the previous snapshot, or none) and may begin in five ways:

* **scratch**: no input; a freshly seeded model at step 0;
* **resume**: the input snapshot, exactly (weights, optimizer, cursor, RNG, guard);
* **resume point**: a stopped attempt of this very job left ``train/resume/step_{until}``
  (same input snapshot, path and files; same end step; same train signature:
  :func:`same_segment`): continue from there, not from the input (the same slot holds a
  finished segment's files afterwards, which the launcher adopts: :mod:`.finished`);
* **rollback**: a retry (attempt > 1) whose input and signature are the ones a spike-guard
  abort recorded in ``train/rollback.json``: resume it and jump the data cursor past the bad
  window;
* **warm start**: no input but another snapshot's weights only (the imported ``init/`` of a
  ``model.init_from`` run, or ``--warm-start``), everything else fresh at step 0.

The job's inputs (input snapshot, warm-start snapshot, attempt number from the per-attempt
log, not a Snakemake resource) go in; the trainer restores from the one value that comes out.

What a retry applies (a resume point, a finished segment, a rollback record) carries the
*train signature* it was made under (:func:`segment_signature`: what determines the weights,
the segment rule's ``params.signature``). Another signature, or none recorded, means the
config changed between the attempts (``train.lr``, the seed, …): the state was made under
other values than the config says, so it is never continued; the segment starts from its
input instead.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.tokenizer_files import fixed_vocab_size
from ..errors import ConfigError
from ..spec.config import Config
from ..spec.data_id import data_id
from ..spec.layout import RunLayout
from ..spec.names import MANIFEST_NAME, PACK_METADATA
from ..spec.signatures import train_signature
from . import rollback

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentStart:
    """Where one segment job begins (see the module docstring for the five kinds)."""

    input: Path | None  # the job's input snapshot (its last good one); None: none
    until_step: int  # the step the segment ends at
    attempt: int  # 1 for a first try; > 1 for a retry
    signature: str  # the job's train signature (:func:`segment_signature`)
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


def same_input(recorded: str | None, input_snapshot: Path | None) -> bool:
    """Whether a record's input snapshot is ``input_snapshot`` (paths compared resolved: a
    job may name it relative to Snakemake's directory, its torchrun workers absolute)."""
    if recorded is None or input_snapshot is None:
        return recorded is None and input_snapshot is None
    return Path(recorded).resolve() == Path(input_snapshot).resolve()


def input_digest(input_snapshot: Path | None) -> str | None:
    """The sha256 of the input snapshot's ``MANIFEST.json`` (which holds every file's):
    the same path rebuilt by another training is another input."""
    if input_snapshot is None:
        return None
    try:
        return hashlib.sha256((Path(input_snapshot) / MANIFEST_NAME).read_bytes()).hexdigest()
    except OSError:
        return None


def same_job(record: dict[str, Any], input_snapshot: Path | None, until_step: int) -> bool:
    """Whether a stop or segment record (``input``, ``until_step`` or ``end_step``) names this
    job's input snapshot path and end step."""
    try:
        end = int(record["until_step"] if "until_step" in record else record["end_step"])
        return same_input(record["input"], input_snapshot) and end == until_step
    except (KeyError, TypeError, ValueError):
        return False


def same_segment(record: dict[str, Any], input_snapshot: Path | None, until_step: int,
                 signature: str) -> bool:
    """Whether a record is of this very segment: :func:`same_job`, the same input files (the
    ``input_manifest`` digest; a record written before digests is judged by the path) and
    made under the train ``signature`` (none recorded: another)."""
    digest = record.get("input_manifest")
    return (same_job(record, input_snapshot, until_step) and record.get("signature") == signature
            and (digest is None or digest == input_digest(input_snapshot)))


def read_state(snapshot: Path) -> dict[str, Any] | None:
    """``trainer_state.json`` of ``snapshot`` (None when missing or unreadable)."""
    try:
        state = json.loads((snapshot / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def stop_record(path: Path) -> dict[str, Any] | None:
    """The last stop record of the resume point at ``path`` (None: none, or unreadable)."""
    stops = (read_state(path) or {}).get("preemptions")
    record = stops[-1] if isinstance(stops, list) and stops else None
    return record if isinstance(record, dict) else None


def finished_record(state: dict[str, Any] | None, until_step: int) -> dict[str, Any] | None:
    """The last segment record of a snapshot that ends at ``until_step`` (a finished
    segment kept in its resume point's place, see :mod:`.finished`), else None."""
    try:
        segment = state["segments"][-1] if state and state["step"] == until_step else None
    except (KeyError, IndexError, TypeError):
        return None
    return segment if isinstance(segment, dict) else None


def usable_resume_point(path: Path, resume_from: Path | None, until_step: int,
                        signature: str) -> dict[str, Any] | None:
    """The stop record of the resume point at ``path`` when it was left by an attempt of
    this very job (same input snapshot, same end step, same train signature); else None.
    Anything else there is removed, except this job's own finished segment (which the
    launcher adopts: :func:`.finished.adopt_finished`)."""
    if not path.exists():
        return None
    state = read_state(path)
    done = finished_record(state, until_step)
    if done is not None and same_segment(done, resume_from, until_step, signature):
        return None
    stops = (state or {}).get("preemptions") if done is None else None
    record = stops[-1] if isinstance(stops, list) and stops else None
    if isinstance(record, dict) and same_segment(record, resume_from, until_step, signature):
        return record
    mine = record if isinstance(record, dict) else done
    if mine is not None and same_job(mine, resume_from, until_step) \
            and mine.get("signature") != signature:
        log.warning("resume point %s was made under train signature %s, this job's is %s (the "
                    "config changed since it stopped): not continued, removed; the segment "
                    "starts from %s", path, mine.get("signature", "(none recorded)"),
                    signature, resume_from or "scratch")
    else:
        log.warning("removing %s: it is not a resume point of this job, nor its finished segment "
                    "(input %s, until step %d)", path, resume_from, until_step)
    shutil.rmtree(path, ignore_errors=True)
    return None


def segment_signature(cfg: Config, data_dir: Path) -> str:
    """The job's train signature: what the workflow's ``params.signature`` holds
    (:func:`~pipeline_lib.spec.signatures.train_signature` of the config and the pack's
    ``data_id`` and the tokenizer's fixed vocabulary), recorded with each stop and each
    finished segment."""
    try:
        pack_id = str(json.loads((Path(data_dir) / PACK_METADATA).read_text())["data_id"])
    except (OSError, ValueError, KeyError, TypeError):  # the trainer names a broken pack
        pack_id = data_id(cfg.data)
    return train_signature(cfg, pack_id, fixed_vocab_size(cfg))


def snapshot_step(snapshot: Path) -> int | None:
    """The step ``snapshot`` recorded (None when unreadable: restoring it names the fault)."""
    try:
        return int((read_state(snapshot) or {})["step"])
    except (ValueError, KeyError, TypeError):
        return None


def check_start_inputs(input_snapshot: Path | None, warm_start: Path | None) -> None:
    """A job resumes or warm-starts, never both (checked before anything is touched)."""
    if warm_start is not None and input_snapshot is not None:
        raise ConfigError("--warm-start and --resume-from exclude each other: resume "
                          "continues a run exactly, a warm start begins a new one")


def segment_start(run_dir: Path, input_snapshot: Path | None, until_step: int, *,
                  signature: str, attempt: int = 1,
                  warm_start: Path | None = None) -> SegmentStart:
    """The one decision of how the segment to ``until_step`` begins (a stale resume point
    of another job is removed here); ``signature``: the job's train signature
    (:func:`segment_signature`)."""
    check_start_inputs(input_snapshot, warm_start)
    point = RunLayout.at(run_dir).resume_point(until_step)
    stopped = usable_resume_point(point, input_snapshot, until_step, signature)
    start = SegmentStart(input=input_snapshot, until_step=until_step, attempt=attempt,
                         signature=signature, point=point, stopped=stopped,
                         warm_start=warm_start if stopped is None else None)
    if stopped is not None or attempt < 2:
        return start
    input_step = 0 if input_snapshot is None else snapshot_step(input_snapshot)
    record = (None if input_step is None
              else rollback.matching_record(run_dir, input_snapshot, input_step, signature))
    if record is None:
        return start
    return SegmentStart(input=input_snapshot, until_step=until_step, attempt=attempt,
                        signature=signature, point=point, warm_start=warm_start,
                        rollback={**record, "applied_attempt": attempt})


__all__ = ["SegmentStart", "check_start_inputs", "finished_record", "input_digest", "read_state",
           "same_input", "same_job", "same_segment", "segment_signature", "segment_start",
           "snapshot_step", "stop_record", "usable_resume_point"]
