"""The looped transformer: ``LoopedLM``, its config, the chunked loss, sizes, loop sampling.

Imports are lazy (PEP 562): ``import pipeline_lib.model.size`` or ``ModelConfig`` must not
pull in torch, because the Snakefile computes step counts from ``param_count`` on every call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import LoopSamplingConfig, ModelConfig
from ..lazy import lazy_exports

_LAZY = {
    "LoopedLM": ".looped",
    "LoopContext": ".looped",
    "LoopOutput": ".looped",
    "chunked_cross_entropy": ".loss",
    "MoEFFN": ".moe",
    "param_count": ".size",
    "check_model_config": ".size",
    "sample_loop_count": ".loop_sampling",
    "loop_target": ".loop_sampling",
}

__all__ = [
    "LoopContext",
    "LoopOutput",
    "LoopSamplingConfig",
    "LoopedLM",
    "MoEFFN",
    "ModelConfig",
    "check_model_config",
    "chunked_cross_entropy",
    "loop_target",
    "param_count",
    "sample_loop_count",
]

if TYPE_CHECKING:
    from .loop_sampling import loop_target, sample_loop_count
    from .looped import LoopContext, LoopedLM, LoopOutput
    from .loss import chunked_cross_entropy
    from .moe import MoEFFN
    from .size import check_model_config, param_count


__getattr__ = lazy_exports(__name__, _LAZY)
