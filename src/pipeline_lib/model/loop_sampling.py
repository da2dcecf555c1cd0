"""Loop count of each training step, drawn from a generator seeded by (seed, step).

Seeding by the step (not by a running generator) makes the draw a pure function: a run
resumed at step s, or the same step on every rank, draws exactly what an uninterrupted run
would. Torch-free (numpy only), so it can be used anywhere.

Loop-count curriculum (``ramp_steps`` > 0, Huginn's, arXiv:2502.05171): the sampler's
target rises linearly from ``min_loops`` over the first ``ramp_steps`` steps,

    t(s) = min_loops + (target − min_loops) · min(1, s / ramp_steps),

and the mode's own draw runs with t(s) in place of its target: ``fixed`` runs round(t(s))
loops (target ``model.loops``), ``uniform`` draws from [min_loops, round(t(s))] (target
``max_loops``: the upper end ramps), ``poisson_lognormal`` draws with mean t(s) (target
``mean``). Still a pure function of (seed, step); ``ramp_steps`` 0 is the plain sampler.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from ..spec.config_train import BpttConfig, LoopSamplingConfig

_STREAM = 0x100F  # separates this stream from other uses of (seed, step)
_GRAD_STREAM = 0x6AD  # the gradient loops' draw (progressive backprop), its own stream


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))  # not round(): banker's rounding would make 2.5 → 2


def loop_target(cfg: LoopSamplingConfig, default_loops: int, step: int) -> float:
    """The sampler's target at ``step``: ``model.loops`` (fixed), ``max_loops`` (uniform) or
    ``mean`` (poisson_lognormal), ramped linearly up from ``min_loops`` over ``ramp_steps``."""
    target = {"fixed": float(default_loops), "uniform": float(cfg.max_loops),
              "poisson_lognormal": float(cfg.mean)}.get(cfg.mode)
    if target is None:
        raise ConfigError(f"train.loop_sampling.mode = {cfg.mode!r} is not allowed; use fixed, "
                          "uniform or poisson_lognormal")
    if cfg.ramp_steps <= 0:
        return target
    progress = min(1.0, max(int(step), 0) / cfg.ramp_steps)
    return cfg.min_loops + (target - cfg.min_loops) * progress


def sample_loop_count(cfg: LoopSamplingConfig, default_loops: int, seed: int, step: int) -> int:
    """Loops to run at optimizer step ``step``.

    - ``fixed``: ``default_loops`` (``model.loops``), not clamped.
    - ``uniform``: an integer in [min_loops, max_loops], each equally likely.
    - ``poisson_lognormal`` (Huginn, arXiv:2502.05171): rate ~ LogNormal(log(mean − 1) − σ²/2,
      σ), count = 1 + Poisson(rate), so E[count] = mean before clamping to
      [min_loops, max_loops].

    With ``ramp_steps`` > 0 the target ramps up first (see the module docstring).
    """
    if cfg.min_loops > cfg.max_loops:
        raise ConfigError(f"train.loop_sampling.min_loops = {cfg.min_loops} exceeds max_loops = "
                          f"{cfg.max_loops}; swap them")
    target = loop_target(cfg, default_loops, step)
    if cfg.mode == "fixed":
        return int(default_loops) if cfg.ramp_steps <= 0 else _round_half_up(target)
    rng = np.random.default_rng([int(seed), int(step), _STREAM])
    if cfg.mode == "uniform":
        high = _round_half_up(target)  # max_loops itself without a ramp
        count = int(rng.integers(cfg.min_loops, high + 1))
    else:  # poisson_lognormal
        extra_mean = target - 1.0  # mean of the Poisson part; the +1 makes count >= 1
        if extra_mean <= 0:
            count = 1
        else:
            mu = math.log(extra_mean) - cfg.sigma**2 / 2  # so that E[rate] = extra_mean
            rate = rng.lognormal(mu, cfg.sigma)
            count = 1 + int(rng.poisson(rate))
    return min(max(count, cfg.min_loops), cfg.max_loops)


def deepest_loops(cfg: LoopSamplingConfig, default_loops: int) -> int:
    """The most loops any training step runs: ``max_loops`` when counts are drawn (uniform,
    poisson_lognormal: both clamp to it), else ``default_loops`` (``model.loops``). H_eff
    past it are loops the model never ran in training."""
    return int(cfg.max_loops if cfg.mode != "fixed" else default_loops)


def gradient_loops(bptt: BpttConfig, loops: int, seed: int, step: int) -> int:
    """Of the ``loops`` run at optimizer step ``step``, how many (the last ones) carry
    gradients (``train.bptt``): all of them under ``full`` and ``unrolled`` (each unroll
    backpropagates through its own loops), ``min(k, loops)`` under ``truncated``, and under
    ``progressive`` a count drawn uniformly from 1..min(k, loops) (Bansal et al. 2022, "End-to-end
    algorithm synthesis with recurrent networks": n loops without gradient, then k with, so
    that every loop learns one reusable step from whatever state the earlier ones left);
    a pure function of (seed, step) like the loop count, so a resumed run draws the same."""
    if bptt.mode == "truncated":
        return min(bptt.k, loops)
    if bptt.mode != "progressive":
        return loops
    rng = np.random.default_rng([int(seed), int(step), _GRAD_STREAM])
    return int(rng.integers(1, min(bptt.k, loops) + 1))


class LoopSampler:
    """The loop count of every step (:func:`sample_loop_count`) as a stateful part: its
    rule and settings, and the count of the last step run (``trainer_state["loop_sampling"]``).
    The draw itself has no state to carry: it is a pure function of (seed, step)."""

    def __init__(self, cfg: LoopSamplingConfig, default_loops: int, seed: int):
        self.cfg, self.default_loops, self.seed = cfg, default_loops, seed
        self.last_loops: int | None = None

    def loops(self, step: int) -> int:
        return sample_loop_count(self.cfg, self.default_loops, self.seed, step)

    def state_dict(self) -> dict[str, object]:
        c = self.cfg
        return {"rule": "sample_loop_count(seed, step)", "seed": self.seed, "mode": c.mode,
                "min_loops": c.min_loops, "max_loops": c.max_loops, "ramp_steps": c.ramp_steps,
                "last_loops": self.last_loops}

    def load_state_dict(self, state: dict[str, object]) -> None:
        last = state.get("last_loops")
        self.last_loops = None if last is None else int(last)  # type: ignore[call-overload]
