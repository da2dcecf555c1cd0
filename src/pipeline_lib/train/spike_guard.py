"""Spike guard: skip optimizer steps on non-finite or spiking losses; abort on a run of them.

Semantics (the research prototype's, made exact). For each observed loss — one per global
step, or one per unroll in unrolled backprop — the step is skipped when any of these holds
(the trainer keys each loss by the loops it read out, :func:`.step.guard_key`, so every
sampled loop count has its own baseline: a retrofit near its original at 1 loop and far
from it at 4 is not a spike at 4):

1. ``non_finite_loss`` / ``non_finite_grad``: loss or gradient norm is NaN or ±inf
   (always checked, also during warmup);
2. ``loss_spike``: ``loss > baseline + max(delta_floor, (rel_threshold − 1)·baseline)``,
   i.e. both ``loss − baseline > delta_floor`` and ``loss > rel_threshold·baseline``;
3. ``ratio_jump``: ``loss / prev_loss > ratio_jump`` (``prev_loss > 0``) and
   ``loss − prev_loss > delta_floor``: near zero a ratio is noise (a task learned to a loss
   of 0.004 moving to 0.015 is no spike, and once such steps were skipped eight times in a
   row the segment aborted);
4. ``hard_jump``: ``loss − prev_loss > hard_jump``.

``baseline`` is an EMA (``ema_beta``) of accepted losses of that key, started at its first
accepted loss; ``prev_loss`` is the key's last accepted loss. Skipped losses never update
them, so a spike cannot drag the baseline up. Checks 2–4 start once the key has absorbed
``warmup_steps`` accepted losses ("while baselines settle"; a key first seen late, e.g. a
loop count drawn rarely, gets its own warmup, and only the non-finite checks guard it
until then).

A global step counts as skipped when any of its observations was (the trainer drops the
remaining unrolls of that step). :meth:`SpikeGuard.end_step` closes a step; after
``abort_consecutive`` consecutive skipped steps it emits an ``abort`` event and raises
:class:`TrainingError` naming the last good snapshot. Every event is a JSON-able dict,
handed to ``event_sink`` (the trainer appends it to ``train/spike_events.jsonl``) and
returned; non-finite floats in events are written as the strings "nan", "inf", "-inf".
With ``enabled: false`` the guard accepts everything and records nothing. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, TrainingError
from ..spec.config_train import SpikeGuardConfig

STATE_VERSION = 1
EventSink = Callable[[dict[str, Any]], None]


def json_float(value: float | None) -> float | str | None:
    """A float for a JSON line: non-finite values become "nan" / "inf" / "-inf"."""
    if value is None or math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


@dataclass(frozen=True)
class SpikeDecision:
    """Outcome of one observation: ``skip`` the optimizer step or not, and why."""

    skip: bool
    reason: str | None = None
    event: dict[str, Any] | None = None


class SpikeGuard:
    """Per-key EMA baselines, consecutive-skip counting, events; state is JSON-able."""

    def __init__(self, cfg: SpikeGuardConfig, *, last_good_snapshot: str | Path | None = None,
                 event_sink: EventSink | None = None):
        self.cfg = cfg
        self.last_good_snapshot = None if last_good_snapshot is None else str(last_good_snapshot)
        self.event_sink = event_sink
        self.baselines: dict[str, dict[str, float | int]] = {}
        self.consecutive = 0
        self.skipped_total = 0
        self.step_skipped = False
        self._step: int | None = None

    # ------------------------------------------------------------------ decisions

    def observe(self, step: int, loss: float, grad_norm: float | None = None, *,
                key: str | int = "0") -> SpikeDecision:
        """Judge one loss (and its gradient norm, when known) of global step ``step``."""
        if not self.cfg.enabled:
            return SpikeDecision(skip=False)
        if self._step is not None and step != self._step:
            raise AssertionError(f"observe(step={step}) before end_step({self._step})")
        self._step = step
        key = str(key)
        loss, base = float(loss), self.baselines.get(key)
        grad = None if grad_norm is None else float(grad_norm)
        reasons: list[str] = []
        threshold = None
        if not math.isfinite(loss):
            reasons.append("non_finite_loss")
        if grad is not None and not math.isfinite(grad):
            reasons.append("non_finite_grad")
        if not reasons and base is not None and base["count"] >= self.cfg.warmup_steps:
            ema, prev = float(base["ema"]), float(base["prev"])
            threshold = ema + max(self.cfg.delta_floor, (self.cfg.rel_threshold - 1.0) * ema)
            if loss > threshold:
                reasons.append("loss_spike")
            if prev > 0 and loss / prev > self.cfg.ratio_jump and \
                    loss - prev > self.cfg.delta_floor:
                reasons.append("ratio_jump")
            if loss - prev > self.cfg.hard_jump:
                reasons.append("hard_jump")
        if not reasons:
            self._accept(key, loss)
            return SpikeDecision(skip=False)
        self.step_skipped = True
        event = self._emit({
            "event": "skip", "step": step, "key": key, "reason": reasons[0], "reasons": reasons,
            "loss": json_float(loss), "grad_norm": json_float(grad),
            "baseline": None if base is None else base["ema"],
            "prev_loss": None if base is None else base["prev"],
            "threshold": threshold, "consecutive": self.consecutive + 1,
        })
        return SpikeDecision(skip=True, reason=reasons[0], event=event)

    def _accept(self, key: str, loss: float) -> None:
        base = self.baselines.get(key)
        if base is None:
            self.baselines[key] = {"ema": loss, "prev": loss, "count": 1}
            return
        beta = self.cfg.ema_beta
        base["ema"] = beta * float(base["ema"]) + (1.0 - beta) * loss
        base["prev"] = loss
        base["count"] = int(base["count"]) + 1

    def end_step(self, step: int) -> bool:
        """Close global step ``step``; returns whether it was skipped.

        Raises TrainingError (after emitting an ``abort`` event) when this makes
        ``abort_consecutive`` skipped steps in a row.
        """
        if not self.cfg.enabled:
            return False
        skipped = self.step_skipped
        self.step_skipped, self._step = False, None
        if not skipped:
            self.consecutive = 0
            return False
        self.consecutive += 1
        self.skipped_total += 1
        if self.consecutive >= self.cfg.abort_consecutive:
            good = self.last_good_snapshot or "none (this run started from scratch)"
            self._emit({"event": "abort", "step": step, "consecutive": self.consecutive,
                        "last_good_snapshot": self.last_good_snapshot})
            raise TrainingError(
                f"spike guard aborted at step {step}: {self.consecutive} consecutive skipped "
                f"steps (train.spike.abort_consecutive = {self.cfg.abort_consecutive}); last "
                f"good snapshot: {good}; rerun the segment to roll back from it (a retry skips "
                "train.rollback_skip_steps steps of data) or relax the train.spike thresholds")
        return True

    def record(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        """Emit another event (e.g. ``rollback``, ``warm_start``) through the same sink."""
        return self._emit({"event": kind, "step": step, **fields})

    def _emit(self, event: dict[str, Any]) -> dict[str, Any]:
        if self.event_sink is not None:
            self.event_sink(event)
        return event

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state (goes into trainer_state.json); restores decisions exactly."""
        return {
            "version": STATE_VERSION,
            "baselines": {k: dict(v) for k, v in sorted(self.baselines.items())},
            "consecutive": self.consecutive,
            "skipped_total": self.skipped_total,
            "step": self._step,
            "step_skipped": self.step_skipped,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise CheckpointError(f"spike-guard state has version "
                                  f"{state.get('version') if isinstance(state, dict) else None!r}"
                                  f", this code reads {STATE_VERSION}; warm-start instead")
        try:
            self.baselines = {str(k): {"ema": float(v["ema"]), "prev": float(v["prev"]),
                                       "count": int(v["count"])}
                              for k, v in state["baselines"].items()}
            self.consecutive = int(state["consecutive"])
            self.skipped_total = int(state["skipped_total"])
            self._step = None if state.get("step") is None else int(state["step"])
            self.step_skipped = bool(state.get("step_skipped", False))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"spike-guard state in trainer_state.json is malformed ({exc!r});"
                                  " the snapshot is corrupted, resume from another one") from None
