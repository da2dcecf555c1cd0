"""Loop-count sampling: deterministic per (seed, step), right range and mean."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.config import LoopSamplingConfig
from pipeline_lib.errors import ConfigError
from pipeline_lib.model import sample_loop_count


def _draws(cfg: LoopSamplingConfig, seed: int = 7, steps: int = 2000) -> np.ndarray:
    return np.array([sample_loop_count(cfg, 4, seed, s) for s in range(steps)])


def test_fixed_returns_default_loops():
    cfg = LoopSamplingConfig(mode="fixed", min_loops=1, max_loops=2)
    assert {sample_loop_count(cfg, 6, 0, s) for s in range(10)} == {6}


def test_uniform_covers_the_range_evenly():
    draws = _draws(LoopSamplingConfig(mode="uniform", min_loops=2, max_loops=5))
    values, counts = np.unique(draws, return_counts=True)
    assert values.tolist() == [2, 3, 4, 5]
    assert counts.min() > 400  # 500 expected each out of 2000


def test_poisson_lognormal_mean_and_clamping():
    cfg = LoopSamplingConfig(mode="poisson_lognormal", mean=4.0, sigma=0.5, min_loops=1,
                             max_loops=64)
    draws = _draws(cfg, steps=4000)
    assert draws.min() >= 1
    assert abs(draws.mean() - 4.0) < 0.15
    clamped = _draws(LoopSamplingConfig(mode="poisson_lognormal", mean=4.0, min_loops=3,
                                        max_loops=5))
    assert clamped.min() == 3 and clamped.max() == 5


def test_mean_one_always_gives_one():
    cfg = LoopSamplingConfig(mode="poisson_lognormal", mean=1.0, min_loops=1, max_loops=8)
    assert set(_draws(cfg, steps=50).tolist()) == {1}


@pytest.mark.parametrize("mode", ["uniform", "poisson_lognormal"])
def test_same_seed_and_step_give_same_draw(mode):
    cfg = LoopSamplingConfig(mode=mode, min_loops=1, max_loops=16)
    first = _draws(cfg, seed=3, steps=200)
    # A resumed run draws step by step from the middle: same values.
    resumed = np.array([sample_loop_count(cfg, 4, 3, s) for s in range(100, 200)])
    assert np.array_equal(first[100:], resumed)
    assert not np.array_equal(first, _draws(cfg, seed=4, steps=200))


def test_min_above_max_raises():
    with pytest.raises(ConfigError, match="min_loops"):
        sample_loop_count(LoopSamplingConfig(mode="uniform", min_loops=5, max_loops=2), 4, 0, 0)
