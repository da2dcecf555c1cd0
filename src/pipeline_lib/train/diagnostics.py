"""Diagnostics every ``train.diagnostics_interval`` steps: per-block gradient norm and
activation RMS, and the injection scale λ (MoE expert loads are in every step's line).

Activation RMS comes from forward hooks installed only for a diagnostic step (no cost on
the others); hooks only read outputs, so a diagnostic step computes exactly what any other
step computes. A core block runs once per loop: its RMS is the mean over the loops and
its ``…/last`` value the RMS after the final loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

PREFIX = "diag"


def named_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``("prelude.0", block)``, ``("core.0", …)``, ``("coda.0", …)`` in model order."""
    out = []
    for stack in ("prelude", "core", "coda"):
        for i, block in enumerate(getattr(model, stack, ())):
            out.append((f"{stack}.{i}", block))
    return out


def due(step: int, interval: int) -> bool:
    """Whether global step ``step`` (1-based) is a diagnostic step."""
    return interval > 0 and step % interval == 0


class ActivationProbe:
    """Collects the output RMS of every block while :meth:`attached`."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.last: dict[str, float] = {}

    def _hook(self, name: str):
        def record(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            rms = float(output.detach().float().pow(2).mean().sqrt())
            self.sums[name] = self.sums.get(name, 0.0) + rms
            self.counts[name] = self.counts.get(name, 0) + 1
            self.last[name] = rms
        return record

    @contextmanager
    def attached(self) -> Iterator[ActivationProbe]:
        handles = [block.register_forward_hook(self._hook(name))
                   for name, block in named_blocks(self.model)]
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, total in self.sums.items():
            out[f"{PREFIX}/act_rms/{name}"] = total / self.counts[name]
            if name.startswith("core."):
                out[f"{PREFIX}/act_rms/{name}/last"] = self.last[name]
        return out


def _norm(params: Iterator[nn.Parameter]) -> float | None:
    sq = [_full(p.grad.detach().float().pow(2).sum()) for p in params if p.grad is not None]
    if not sq:
        return None
    return math.sqrt(float(torch.stack(sq).sum()))


def _full(value: torch.Tensor) -> torch.Tensor:
    """A sum over an FSDP-sharded gradient is a partial DTensor: complete it (collective)."""
    # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def gradient_metrics(model: nn.Module) -> dict[str, float]:
    """Gradient L2 norm per block, of the embedding, and of the final norm (current .grad)."""
    out: dict[str, float] = {}
    parts: list[tuple[str, nn.Module | None]] = [*named_blocks(model),
                                                 ("tok_emb", getattr(model, "tok_emb", None)),
                                                 ("norm", getattr(model, "norm", None)),
                                                 ("head", getattr(model, "head", None))]
    for name, module in parts:
        if module is None:
            continue
        value = _norm(module.parameters())
        if value is not None:
            out[f"{PREFIX}/grad_norm/{name}"] = value
    return out


def model_scalars(model: nn.Module) -> dict[str, float]:
    """λ (the injection scale) and the loop gates g_2, g_3, … when the model has them."""
    out: dict[str, float] = {}
    scale = getattr(model, "injection_scale", None)
    if isinstance(scale, torch.Tensor) and scale.numel() == 1:
        out[f"{PREFIX}/injection_scale"] = float(scale.detach())
    gates = getattr(model, "loop_gate", None)
    if isinstance(gates, torch.Tensor):
        for t, g in enumerate(gates.detach().float().tolist(), start=2):
            out[f"{PREFIX}/loop_gate/{t}"] = g
    return out
