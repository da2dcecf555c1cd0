"""Learning-rate schedules (warmup + cosine, warmup–stable–decay) and batch-size lr scaling.

The schedule is a pure function of the optimizer step, so a resumed segment sets exactly
the lr an uninterrupted run would have set; nothing about it needs checkpointing.
Step ``s`` is the 0-based index of the optimizer step about to be taken:

- warmup (``s < warmup_steps``): ``(s + 1) / warmup_steps``, reaching 1 at the last warmup step;
- ``cosine``: ``min + (1 − min)·½(1 + cos(π·p))`` with
  ``p = (s − warmup) / (total − warmup − 1)``: 1 at the first step after warmup, ``min``
  at the last step (``total − 1``);
- ``wsd``: 1 until the last ``round(decay_fraction·total)`` steps (never inside warmup), then
  linear ``1 − (1 − min)·p`` with ``p = (s − decay_start + 1) / (total − decay_start)``,
  reaching ``min`` at the last step (WSD: Hu et al. 2024, MiniCPM, arXiv:2404.06395);
- steps at or past ``total`` stay at ``min`` (wsd without decay steps: at 1).

Per-group peak lrs live in each param group's ``"peak_lr"`` (set by
:func:`pipeline_lib.train.optim.build_optimizer`); :meth:`LRSchedule.apply` sets
``group["lr"] = group["peak_lr"] · multiplier``. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..spec.config_train import TrainConfig

SCHEDULES = ("cosine", "wsd")
LR_SCALINGS = ("none", "sqrt", "linear")


def lr_multiplier(step: int, *, total_steps: int, warmup_steps: int, schedule: str,
                  min_lr_ratio: float, decay_fraction: float = 0.2) -> float:
    """Factor on the peak lr at optimizer step ``step`` (see the module docstring)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"train.schedule = {schedule!r} is unknown; use one of {SCHEDULES}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "cosine":
        span = total_steps - warmup_steps - 1
        progress = 1.0 if span <= 0 else min(1.0, (step - warmup_steps) / span)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    decay_steps = round(decay_fraction * total_steps)
    decay_start = max(warmup_steps, total_steps - decay_steps)
    if step < decay_start or decay_start >= total_steps:
        return 1.0  # stable phase (also: no decay configured)
    progress = min(1.0, (step - decay_start + 1) / (total_steps - decay_start))
    return 1.0 - (1.0 - min_lr_ratio) * progress


def scale_lr(lr: float, global_batch_rows: int, reference_batch_rows: int, mode: str) -> float:
    """``lr`` given at ``reference_batch_rows``, scaled to ``global_batch_rows``:
    none (unchanged), sqrt (Adam-style, ×√(G/ref)) or linear (×G/ref)."""
    if mode == "none":
        return lr
    ratio = global_batch_rows / reference_batch_rows
    if mode == "sqrt":
        return lr * math.sqrt(ratio)
    if mode == "linear":
        return lr * ratio
    raise ConfigError(f"train.lr_scaling = {mode!r} is unknown; use one of {LR_SCALINGS}")


@dataclass(frozen=True)
class LRSchedule:
    """The lr multiplier of one run; build with :meth:`from_config`."""

    total_steps: int
    warmup_steps: int
    schedule: str = "cosine"
    min_lr_ratio: float = 0.1
    decay_fraction: float = 0.2

    @classmethod
    def from_config(cls, train: TrainConfig, total_steps: int) -> LRSchedule:
        """From the train section; ``total_steps`` from :func:`pipeline_lib.spec.budget.total_steps`."""
        if train.schedule not in SCHEDULES:
            raise ConfigError(f"train.schedule = {train.schedule!r} is unknown; use one of "
                              f"{SCHEDULES}")
        return cls(total_steps=total_steps, warmup_steps=train.warmup_steps,
                   schedule=train.schedule, min_lr_ratio=train.min_lr_ratio,
                   decay_fraction=train.decay_fraction)

    def multiplier(self, step: int) -> float:
        return lr_multiplier(step, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                             schedule=self.schedule, min_lr_ratio=self.min_lr_ratio,
                             decay_fraction=self.decay_fraction)

    def apply(self, param_groups: Iterable[MutableMapping[str, Any]], step: int) -> float:
        """Set every group's ``lr`` to ``peak_lr × multiplier(step)``; returns the multiplier.

        Pass ``optimizer.param_groups``. Groups without ``peak_lr`` raise KeyError: build the
        optimizer with :func:`~pipeline_lib.train.optim.build_optimizer`.
        """
        mult = self.multiplier(step)
        for group in param_groups:
            group["lr"] = group["peak_lr"] * mult
        return mult
