"""Preemption-safe segments: stop cleanly on SIGTERM/SIGUSR1 or near the job's time limit.

A cluster ends a job with SIGTERM (SLURM: at the time limit or a preemption, some seconds
before SIGKILL) and can be asked for SIGUSR1 minutes earlier (``--signal=USR1@<margin>``, as every
segment job asks: :func:`pipeline_lib.workflow.cluster_resources.segment_time`). :class:`StopRequest` turns either signal, or the segment's own wall
clock passing ``train.segment_runtime_minutes − train.stop_margin_minutes``, into a request
that the step loop honours after the step it is in: the trainer then writes a *resume
point* (a complete snapshot under ``{run}/train/resume/step_{until}``, outside the job's
declared outputs, so Snakemake's cleanup of the failed job leaves it), commits the metrics
of the steps done, and raises :class:`~pipeline_lib.errors.Preempted`. A retry of the same
job (same input snapshot, same end step, same train signature) continues from the resume
point and ends bit-identical to an uninterrupted segment; the finished segment's files then
take its place (:mod:`.finished`).

Several ranks agree on stopping every step (one collective), so all of them stop after the
same step.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType
from typing import Any

from ..spec.config_train import TrainConfig

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

# A stop signal that arrived before the step loop (see latch_stop_signals)
_latched: dict[str, str | None] = {"reason": None}


def _latch(signum: int, frame: FrameType | None) -> None:
    if _latched["reason"] is None:
        _latched["reason"] = signal.Signals(signum).name
        log.warning("%s received before the step loop: the segment will stop at its first "
                    "step with a resume point", _latched["reason"])


def latched_signal() -> int | None:
    """The stop signal remembered before the step loop, if any (its number)."""
    reason = _latched["reason"]
    return None if reason is None else int(signal.Signals[reason])


def latch_stop_signals() -> None:
    """From now until the step loop, a stop signal is remembered rather than fatal: the
    segment job calls this first thing (a SIGUSR1 or SIGTERM while it imports torch, loads
    the data or restores the snapshot would otherwise kill it before it could write a
    resume point); :class:`StopRequest` takes the remembered signal over."""
    if threading.current_thread() is threading.main_thread():
        for sig in STOP_SIGNALS:
            signal.signal(sig, _latch)


class StopRequest:
    """While entered: the stop signals set a flag instead of ending the process."""

    def __init__(self, train: TrainConfig, *, started: float | None = None) -> None:
        self.reason: str | None = _latched["reason"]
        budget = (train.segment_runtime_minutes - train.stop_margin_minutes) * 60.0
        start = time.monotonic() if started is None else started
        self.deadline = start + budget if train.stop_margin_minutes > 0 else None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.reason is None:
            self.reason = signal.Signals(signum).name
            log.warning("%s received: stopping after the current step and writing a resume "
                        "point", self.reason)

    def requested(self, group: Any = None) -> str | None:
        """The reason to stop now (signal name or ``time limit``), agreed by all ranks."""
        if self.reason is None and self.deadline is not None and time.monotonic() > self.deadline:
            self.reason = "time limit (train.segment_runtime_minutes − stop_margin_minutes)"
        if group is not None and group.any(self.reason is not None) and self.reason is None:
            self.reason = "a stop on another rank"
        return self.reason


__all__ = ["STOP_SIGNALS", "StopRequest", "latch_stop_signals", "latched_signal"]
