"""Where a segment's per-step records go: JSON lines, TensorBoard, MLflow, the snapshot.

One record per optimizer step (``step`` = 1..total, 1-based). :class:`TrainLog` (rank 0
only; other ranks pass ``enabled=False``):

- keeps the segment's lines for the snapshot's ``metrics.jsonl`` and ``spike_events.jsonl``;
- streams them into the run's ``train/metrics.jsonl`` / ``train/spike_events.jsonl``
  (live, for ``tail -f``), after first cutting the files back to the resume step, so a
  crashed attempt's tail never appears twice (spike-log ``abort``/``rollback`` events are
  kept: they explain why a segment was rerun);
- writes numeric fields as TensorBoard scalars under ``{run}/tensorboard`` (named
  ``train/{key}``, except keys of their own namespace such as ``val/loss_h4``, the
  validation loss after 4 loops, which keep their name; see :func:`metric_name`) with
  ``purge_step = resume step + 1`` (a crashed attempt's tail is hidden; the previous
  segment's last step stays);
- buffers them into the MLflow child run; :meth:`commit` (after the snapshot is durable)
  flushes them exactly once.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from ..fsio import write_text_atomic
from ..spec.layout import RunLayout

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"  # the snapshot's copies of the segment's lines
SPIKE_FILE = "spike_events.jsonl"
KEEP_EVENTS = frozenset({"abort", "rollback"})
NON_SCALAR = frozenset({"step", "cursor", "unroll_losses"})
OWN_NAMESPACES = ("val/",)  # record keys logged under their own name, not under train/


def _line(record: Mapping[str, Any]) -> str:
    return json.dumps(record, sort_keys=False, allow_nan=True) + "\n"


def _lines(blob: bytes) -> list[str]:
    return blob.decode().splitlines(keepends=True)


def cut_jsonl(path: Path, resume_step: int, keep_events: frozenset[str] = frozenset()) -> int:
    """Rewrite ``path`` without lines whose ``step`` exceeds ``resume_step`` (except events
    whose ``event`` is in ``keep_events``) and without a torn last line; returns lines
    dropped. Atomic (temporary file + rename)."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for raw in path.read_text().splitlines(keepends=True):
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError:  # a line torn by a kill mid-write
            dropped += 1
            continue
        if not isinstance(rec, dict) or (int(rec.get("step", 0)) > resume_step
                                         and rec.get("event") not in keep_events):
            dropped += 1
            continue
        kept.append(raw if raw.endswith("\n") else raw + "\n")
    if dropped:
        write_text_atomic(path, "".join(kept))
        log.info("%s: dropped %d lines past step %d (an earlier attempt's tail)", path,
                 dropped, resume_step)
    return dropped


def scalar_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The numeric, finite-or-not scalar fields of a record (for TensorBoard and MLflow)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in NON_SCALAR or isinstance(value, (str, list, dict)) or value is None:
            continue
        out[key] = float(value)
    return out


def metric_name(key: str) -> str:
    """The TensorBoard / MLflow name of a record's key: ``train/{key}``, or the key itself
    when it starts with one of :data:`OWN_NAMESPACES` (``val/loss_h4``)."""
    return key if key.startswith(OWN_NAMESPACES) else f"train/{key}"


class TrainLog:
    """Sinks of one segment's step records and spike events (see the module docstring)."""

    def __init__(self, run_dir: Path, resume_step: int, *, stage: Any = None,
                 enabled: bool = True, tensorboard: bool = True) -> None:
        self.enabled = enabled
        self.stage = stage
        self.lines: list[str] = []
        self.events: list[str] = []
        self._tb: Any = None
        self._metrics_fh = self._events_fh = None
        if not enabled:
            return
        layout = RunLayout.at(run_dir)
        self.metrics_path, self.events_path = layout.metrics, layout.spike_log
        layout.train_dir.mkdir(parents=True, exist_ok=True)
        cut_jsonl(self.metrics_path, resume_step)
        cut_jsonl(self.events_path, resume_step, KEEP_EVENTS)
        self._metrics_fh = open(self.metrics_path, "a", buffering=1)  # noqa: SIM115 (closed in close())
        self._events_fh = open(self.events_path, "a", buffering=1)  # noqa: SIM115
        if tensorboard:
            self._tb = SummaryWriter(log_dir=str(layout.tensorboard),
                                     purge_step=resume_step + 1)

    def step(self, record: Mapping[str, Any]) -> None:
        """Record one optimizer step's metrics (``record["step"]`` is the 1-based step)."""
        if not self.enabled:
            return
        line = _line(record)
        self.lines.append(line)
        assert self._metrics_fh is not None
        self._metrics_fh.write(line)
        step = int(record["step"])
        scalars = {metric_name(key): value for key, value in scalar_metrics(record).items()}
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
        if self.stage is not None:
            self.stage.log_metrics(step, {k: v for k, v in scalars.items() if math.isfinite(v)})

    def event(self, event: Mapping[str, Any]) -> None:
        """A spike-guard (or rollback) event: snapshot copy + run-level spike log."""
        if not self.enabled:
            return
        line = _line(event)
        self.events.append(line)
        assert self._events_fh is not None
        self._events_fh.write(line)
        self._events_fh.flush()
        os.fsync(self._events_fh.fileno())  # rare, and the record of why a step was skipped

    def carry(self, files: Mapping[str, bytes]) -> None:
        """Begin the snapshot's lines with a resume point's (the job's steps before it
        stopped), so the segment's snapshot holds all of its steps."""
        if self.enabled:
            self.lines = _lines(files.get(METRICS_FILE, b"")) + self.lines
            self.events = _lines(files.get(SPIKE_FILE, b"")) + self.events

    def snapshot_files(self) -> dict[str, str]:
        """The segment's lines, written into its snapshot."""
        return {METRICS_FILE: "".join(self.lines), SPIKE_FILE: "".join(self.events)}

    def commit(self, through_step: int) -> int:
        """Make the run-level files durable and flush MLflow metrics through ``through_step``;
        call only once the snapshot holding these steps is in place."""
        if not self.enabled:
            return 0
        for fh in (self._metrics_fh, self._events_fh):
            if fh is not None:
                fh.flush()
                os.fsync(fh.fileno())
        if self._tb is not None:
            self._tb.flush()
        return self.stage.flush(through_step) if self.stage is not None else 0

    def close(self) -> None:
        for fh in (self._metrics_fh, self._events_fh):
            if fh is not None:
                fh.close()
        self._metrics_fh = self._events_fh = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
