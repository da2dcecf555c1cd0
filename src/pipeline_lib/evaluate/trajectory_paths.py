"""The loop states of sampled tokens as paths: per-loop measures, a class per path, a 2-D PCA.

A token's path is its loop states s_0 (the initial state), s_1, …, s_M after each loop. Per
loop t = 1..M (:func:`path_measures`):

- ``relative_step``: ‖s_t − s_{t−1}‖ / ‖s_t‖ (the ``latent_diff`` exit score);
- ``cosine``: cos(s_t, s_{t−1}) (a zero state counts as cosine 0, as for the ``cosine``
  exit criterion: ``state_init: zeros`` makes s_0 zero);
- ``kl_to_final``: KL(p_t ‖ p_M) of the readout after loop t to the readout after the last
  loop M (nats; 0 at t = M), computed where the loops run (:mod:`.trajectories`).

Each path gets one class (:func:`classify_paths`), judged on its *tail*, the last
``max(SETTLE_LOOPS, ⌈M/2⌉)`` steps (where extrapolation past the training loop count shows),
by rules tried in this order:

1. **converging**: the state settles. Either the relative step is below
   :data:`CONVERGED_STEP` at each of the last :data:`SETTLE_LOOPS` loops (it fell below and
   stayed), or every tail step is at most :data:`SHRINK` times the step before it (a
   contraction towards a fixed point that M loops have not reached yet).
2. **drifting**: the state keeps moving away: its distance from the initial state
   ‖s_t − s_0‖ (the norm, for zero-initialised states) grows at every tail loop, and by at
   least :data:`OUTWARD` of the length the tail travels.
3. **orbiting**: everything else: the steps stay large but the path does not move away; it
   turns back within a bounded region (a cycle, an oscillation, a wandering orbit).

Within M loops an orbit slower than half a turn per tail reads as drifting: raise the loop
count (``--max-loops``) to see more of it.

The PCA (:func:`pca_2d`) is fitted on every state s_0..s_M of every sampled token together,
so all paths share one plane.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from .exit.criteria import relative_step, state_cosine

CLASSES = ("converging", "orbiting", "drifting")
MEASURES = ("relative_step", "cosine", "kl_to_final")
QUANTILES = (0.1, 0.5, 0.9)  # per-loop spread in the JSON (q10, q50, q90)

CONVERGED_STEP = 0.01
"""Relative step below which a state has settled: a 1% change of the state per loop moves
the readout (a norm, then a linear head) about as little, and it is well above the rounding
of a bf16 state (2⁻⁸ ≈ 0.4% relative), so a settled state run in bf16 still counts."""

SETTLE_LOOPS = 2
"""Loops the relative step must stay below :data:`CONVERGED_STEP` at the end: one small
step alone can be the turning point of an oscillation, where the state slows down."""

SHRINK = 0.7
"""Largest ratio of one tail step's length to the previous one that counts as contraction:
a constant-speed drift or orbit has ratio ≈ 1, a geometric approach to a fixed point its
rate (< 1); 0.7 keeps clear of the noise in an orbit's step lengths."""

OUTWARD = 0.5
"""Fraction of the tail's path length that must be net growth of the distance from the
initial state for a drift: a straight run away has 1, an orbit around the start about 0."""


def path_measures(states: Tensor) -> dict[str, Tensor]:
    """``relative_step`` and ``cosine`` [n, M] of paths ``states`` [n, M+1, D] (float64)."""
    s = states.double()
    now, before = s[:, 1:], s[:, :-1]
    return {"relative_step": relative_step(now, before), "cosine": state_cosine(now, before)}


def tail_steps(max_loops: int) -> int:
    """Steps in a path's tail (see the module docstring)."""
    return min(max_loops, max(SETTLE_LOOPS, math.ceil(max_loops / 2)))


def classify_paths(states: Tensor) -> list[str]:
    """One of :data:`CLASSES` per path ``states`` [n, M+1, D] (rules: module docstring)."""
    s = states.double()
    n, m = s.shape[0], s.shape[1] - 1
    if m < 1:
        raise ValueError("a path needs at least one loop after the initial state")
    k = tail_steps(m)
    relative = path_measures(s)["relative_step"]  # [n, M]
    steps = (s[:, 1:] - s[:, :-1]).norm(dim=-1)[:, -k:]  # [n, k] tail step lengths
    settled = (relative[:, -min(SETTLE_LOOPS, m):] < CONVERGED_STEP).all(dim=1)
    contracting = ((steps[:, 1:] <= SHRINK * steps[:, :-1]) & (steps[:, :-1] > 0)).all(dim=1)
    if k < 2:
        contracting = torch.zeros(n, dtype=torch.bool)
    away = (s[:, -k - 1:] - s[:, :1]).norm(dim=-1)  # [n, k+1] distance from s_0
    growing = (away[:, 1:] > away[:, :-1]).all(dim=1)
    outward = (away[:, -1] - away[:, 0]) >= OUTWARD * steps.sum(dim=1)
    out = []
    for i in range(n):
        if settled[i] or contracting[i]:
            out.append("converging")
        elif growing[i] and outward[i]:
            out.append("drifting")
        else:
            out.append("orbiting")
    return out


def pca_2d(states: Tensor) -> tuple[Tensor, list[float]]:
    """(projection [n, M+1, 2], explained variance ratio of the two axes) of every state of
    every path ``states`` [n, M+1, D], fitted on all of them together (float64 SVD; the sign
    of each axis fixed so its largest loading is positive, for stable figures)."""
    flat = states.double().reshape(-1, states.shape[-1])
    centred = flat - flat.mean(dim=0, keepdim=True)
    _, sing, vh = torch.linalg.svd(centred, full_matrices=False)
    axes = vh[:2]
    if axes.shape[0] < 2:  # D = 1: a second axis of zeros
        axes = torch.cat([axes, torch.zeros_like(axes)])
    largest = axes.gather(1, axes.abs().argmax(dim=1, keepdim=True))  # [2, 1]
    axes = torch.where(largest < 0, -axes, axes)
    total = float((sing ** 2).sum())
    ratio = [float(v) / total if total > 0 else 0.0 for v in (sing[:2] ** 2).tolist()]
    ratio += [0.0] * (2 - len(ratio))
    return (centred @ axes.T).reshape(*states.shape[:-1], 2), ratio


def per_loop_summary(values: Tensor) -> dict[str, list[float]]:
    """Mean and :data:`QUANTILES` over tokens of ``values`` [n, M], per loop."""
    v = values.double()
    out = {"mean": v.mean(dim=0).tolist()}
    q = torch.quantile(v, torch.tensor(QUANTILES, dtype=torch.float64), dim=0)
    for level, row in zip(QUANTILES, q, strict=True):
        out[f"q{round(level * 100)}"] = row.tolist()
    return out


def rules() -> dict[str, Any]:
    """The classification constants, recorded in the JSON beside the classes."""
    return {"converged_step": CONVERGED_STEP, "settle_loops": SETTLE_LOOPS, "shrink": SHRINK,
            "outward": OUTWARD}


def class_counts(classes: Sequence[str]) -> dict[str, int]:
    return {name: sum(c == name for c in classes) for name in CLASSES}
