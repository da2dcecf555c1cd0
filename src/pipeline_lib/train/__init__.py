"""Training: batch plan, lr schedules, optimizers, spike guard, weights EMA (and the loop).

Exports are lazy (PEP 562): the torch-free units (``schedule``, ``batch_plan``,
``spike_guard``) import without torch; ``optim`` and ``ema`` load it when first used.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS = {
    "BatchPlan": "batch_plan",
    "make_batch_plan": "batch_plan",
    "LRSchedule": "schedule",
    "lr_multiplier": "schedule",
    "scale_lr": "schedule",
    "SpikeGuard": "spike_guard",
    "SpikeDecision": "spike_guard",
    "AdamATan2": "optim",
    "build_optimizer": "optim",
    "classify_parameters": "optim",
    "load_optimizer_state": "optim",
    "param_groups": "optim",
    "refresh_group_hparams": "optim",
    "WeightsEMA": "ema",
    "run_training_job": "launch",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
