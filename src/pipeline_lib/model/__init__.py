"""The looped transformer: ``LoopedLM``, its config, the chunked loss, sizes, loop sampling.

Imports are lazy (PEP 562): ``import pipeline_lib.model.size`` or ``ModelConfig`` must not
pull in torch, because the Snakefile computes step counts from ``param_count`` on every call.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..config import LoopSamplingConfig, ModelConfig

_LAZY = {
    "LoopedLM": ".looped",
    "LoopContext": ".looped",
    "LoopOutput": ".looped",
    "chunked_cross_entropy": ".loss",
    "MoEFFN": ".moe",
    "param_count": ".size",
    "check_model_config": ".size",
    "sample_loop_count": ".loop_sampling",
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
    "param_count",
    "sample_loop_count",
]

if TYPE_CHECKING:
    from .loop_sampling import sample_loop_count
    from .looped import LoopContext, LoopedLM, LoopOutput
    from .loss import chunked_cross_entropy
    from .moe import MoEFFN
    from .size import check_model_config, param_count


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
