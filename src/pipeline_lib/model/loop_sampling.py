"""Loop count of each training step, drawn from a generator seeded by (seed, step).

Seeding by the step (not by a running generator) makes the draw a pure function: a run
resumed at step s, or the same step on every rank, draws exactly what an uninterrupted run
would. Torch-free (numpy only), so it can be used anywhere.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import LoopSamplingConfig
from ..errors import ConfigError

_STREAM = 0x100F  # separates this stream from other uses of (seed, step)


def sample_loop_count(cfg: LoopSamplingConfig, default_loops: int, seed: int, step: int) -> int:
    """Loops to run at optimizer step ``step``.

    - ``fixed``: ``default_loops`` (``model.loops``), not clamped.
    - ``uniform``: an integer in [min_loops, max_loops], each equally likely.
    - ``poisson_lognormal`` (Huginn, arXiv:2502.05171): rate ~ LogNormal(log(mean − 1) − σ²/2,
      σ), count = 1 + Poisson(rate), so E[count] = mean before clamping to
      [min_loops, max_loops].
    """
    if cfg.min_loops > cfg.max_loops:
        raise ConfigError(f"train.loop_sampling.min_loops = {cfg.min_loops} exceeds max_loops = "
                          f"{cfg.max_loops}; swap them")
    if cfg.mode == "fixed":
        return int(default_loops)
    rng = np.random.default_rng([int(seed), int(step), _STREAM])
    if cfg.mode == "uniform":
        count = int(rng.integers(cfg.min_loops, cfg.max_loops + 1))
    elif cfg.mode == "poisson_lognormal":
        extra_mean = cfg.mean - 1.0  # mean of the Poisson part; the +1 makes count >= 1
        if extra_mean <= 0:
            count = 1
        else:
            mu = math.log(extra_mean) - cfg.sigma**2 / 2  # so that E[rate] = extra_mean
            rate = rng.lognormal(mu, cfg.sigma)
            count = 1 + int(rng.poisson(rate))
    else:
        raise ConfigError(f"train.loop_sampling.mode = {cfg.mode!r} is not allowed; use fixed, "
                          "uniform or poisson_lognormal")
    return min(max(count, cfg.min_loops), cfg.max_loops)
