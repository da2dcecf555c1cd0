"""The kernels this process chose, as MLflow tags: FlexAttention or SDPA (and why, after a
fallback), and the MoE expert shapes that run the per-expert loop instead of grouped GEMM.

Each stage that ran the model (a training segment, the H_eff sweep, the benchmarks) sets
them on its child run, so a run that quietly lost a fast path shows it in the MLflow UI.
"""

from __future__ import annotations

from .flex import attention_tags
from .moe import moe_tags


def kernel_tags() -> dict[str, str]:
    """``loopline.attention_kernel``, ``loopline.attention_fallback`` and
    ``loopline.moe_grouped_mm_fallback``, each only when it applies."""
    return {**attention_tags(), **moe_tags()}
