"""Rollback after a spike-guard abort: the record the failed job leaves, the retry's jump.

When the guard aborts a segment, the job writes ``{run}/train/rollback.json`` and fails
with a message naming the last good snapshot (its input). When the same job runs again as
a retry (Snakemake ``retries:``, ``attempt > 1``) from that same input snapshot, it
resumes from it with the data cursor moved past the window that caused the abort plus
``train.rollback_skip_steps`` more steps (the prototype's RESUME_SKIP_STEPS), provided the
config's train signature is still the one the record was made under (a window found under
another ``train.lr`` or seed says nothing about this config's run). The step
counter continues from the snapshot; only the data cursor jumps. The applied record goes
into ``trainer_state.json`` (``rollbacks``) and the spike log (``rollback`` event).

Rolling back by hand: rerun the segment with ``--attempt 2`` (the record must name the
snapshot given as ``--resume-from``, under the same config); delete ``rollback.json`` to retry
without skipping.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..data.loader import DataCursor
from ..errors import DataError
from ..fsio import write_text_atomic
from ..spec.layout import RunLayout
from .segment import TrainerState
from .spike_guard import SpikeGuard

log = logging.getLogger(__name__)


def rollback_path(run_dir: Path) -> Path:
    return RunLayout.at(run_dir).rollback_record


def make_record(*, input_snapshot: Path | None, input_step: int, abort_step: int,
                first_bad_step: int, window_start: DataCursor, window_end: DataCursor,
                resume_cursor: DataCursor, skip_steps: int, attempt: int,
                signature: str) -> dict[str, Any]:
    """The rollback record of an aborted segment (plain JSON); ``signature``: the job's
    train signature (:func:`~.segment_start.segment_signature`)."""
    return {
        "input_snapshot": None if input_snapshot is None else str(input_snapshot),
        "input_step": input_step,
        "signature": signature,
        "abort_step": abort_step,
        "window_steps": [first_bad_step, abort_step],
        "window_cursor": [window_start.to_json(), window_end.to_json()],
        "skip_steps": skip_steps,
        "resume_cursor": resume_cursor.to_json(),
        "attempt": attempt,
    }


def write_record(run_dir: Path, record: dict[str, Any]) -> Path:
    """Write ``rollback.json`` atomically (it must survive the job's failure)."""
    path = rollback_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(record, indent=1) + "\n", fsync=True)
    return path


def jump(record: dict[str, Any], state: TrainerState, guard: SpikeGuard, step: int) -> None:
    """Apply ``record`` at its first bad step ``step``: the data cursor jumps past the window
    that caused the abort plus ``skip_steps`` steps (the step counter goes on); the jump is
    recorded in ``state.rollbacks`` and as a ``rollback`` event of the spike guard."""
    if state.cursor.to_json() != record["window_cursor"][0]:
        log.warning("rollback: cursor %s at step %d, the record expected %s; jumping anyway",
                    state.cursor.to_json(), step, record["window_cursor"][0])
    target = DataCursor.from_json(record["resume_cursor"])
    state.rollbacks.append({**record, "step": step, "cursor_before": state.cursor.to_json()})
    guard.record("rollback", step, attempt=record["applied_attempt"],
                 from_cursor=state.cursor.to_json(), to_cursor=target.to_json(),
                 abort_step=record["abort_step"], skip_steps=record["skip_steps"])
    state.cursor = target
    guard.consecutive = 0  # the data that caused the run of skips is behind us


def _same_snapshot(recorded: str | None, given: Path | None) -> bool:
    if recorded is None or given is None:
        return recorded is None and given is None
    a, b = Path(recorded), Path(given)
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a.name == b.name


def _record_of_input(run_dir: Path, input_snapshot: Path | None,
                     input_step: int) -> dict[str, Any] | None:
    """The rollback record written by an aborted attempt from this very input, else None."""
    path = rollback_path(run_dir)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        matches = (int(record["input_step"]) == input_step
                   and _same_snapshot(record["input_snapshot"], input_snapshot))
        DataCursor.from_json(record["resume_cursor"])
    except (OSError, ValueError, KeyError, TypeError, DataError) as exc:
        log.warning("ignoring unreadable rollback record %s (%s)", path, exc)
        return None
    if not matches:
        log.info("rollback record %s is for input step %s, this segment resumes from step %d: "
                 "not applied", path, record.get("input_step"), input_step)
        return None
    return record


def matching_record(run_dir: Path, input_snapshot: Path | None, input_step: int,
                    signature: str) -> dict[str, Any] | None:
    """The rollback record written by an aborted attempt from this very input under the
    train ``signature``, else None (a record of another signature is left to
    :func:`clear_record`)."""
    record = _record_of_input(run_dir, input_snapshot, input_step)
    if record is None or record.get("signature") == signature:
        return record
    log.warning("rollback record %s was made under train signature %s, this job's is %s (the "
                "config changed since the abort): not applied; the segment resumes %s as it is",
                rollback_path(run_dir), record.get("signature", "(none recorded)"), signature,
                input_snapshot or "from scratch")
    return None


def clear_record(run_dir: Path, input_snapshot: Path | None, input_step: int) -> bool:
    """Remove the record once a segment from its input has finished (applied, it lives on
    in ``trainer_state.json``; not applied, of this signature or another, it is stale).
    Returns whether one was removed."""
    if _record_of_input(run_dir, input_snapshot, input_step) is None:
        return False
    rollback_path(run_dir).unlink(missing_ok=True)
    return True
