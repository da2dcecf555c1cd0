"""Loop-count sampling: deterministic per (seed, step), right range and mean."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.model.loop_sampling import gradient_loops, loop_target, sample_loop_count
from pipeline_lib.spec.config_train import BpttConfig, LoopSamplingConfig


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


# ---------------------------------------------------------------- loop-count curriculum


def test_ramp_zero_is_identical_to_the_plain_sampler():
    for mode in ("fixed", "uniform", "poisson_lognormal"):
        plain = LoopSamplingConfig(mode=mode, min_loops=1, max_loops=12, mean=5.0)
        ramp0 = LoopSamplingConfig(mode=mode, min_loops=1, max_loops=12, mean=5.0, ramp_steps=0)
        assert np.array_equal(_draws(plain, steps=300), _draws(ramp0, steps=300)), mode
        assert loop_target(ramp0, 4, 0) == {"fixed": 4, "uniform": 12,
                                            "poisson_lognormal": 5.0}[mode]


def test_ramp_targets_at_chosen_steps():
    fixed = LoopSamplingConfig(mode="fixed", min_loops=1, ramp_steps=100)
    # t(s) = 1 + (8 − 1)·min(1, s/100), model.loops = 8; round half up
    assert [loop_target(fixed, 8, s) for s in (0, 50, 100, 400)] == [1.0, 4.5, 8.0, 8.0]
    assert [sample_loop_count(fixed, 8, 0, s) for s in (0, 10, 50, 64, 100, 400)] == \
        [1, 2, 5, 5, 8, 8]
    uniform = LoopSamplingConfig(mode="uniform", min_loops=2, max_loops=10, ramp_steps=80)
    assert [loop_target(uniform, 4, s) for s in (0, 20, 40, 80)] == [2.0, 4.0, 6.0, 10.0]
    poisson = LoopSamplingConfig(mode="poisson_lognormal", min_loops=1, max_loops=32, mean=9.0,
                                 ramp_steps=10)
    assert [loop_target(poisson, 4, s) for s in (0, 5, 10, 11)] == [1.0, 5.0, 9.0, 9.0]


def test_uniform_ramp_draws_below_the_ramped_upper_end():
    cfg = LoopSamplingConfig(mode="uniform", min_loops=2, max_loops=10, ramp_steps=800)
    for s in range(0, 1000, 7):
        n = sample_loop_count(cfg, 4, 3, s)
        assert 2 <= n <= int(np.floor(loop_target(cfg, 4, s) + 0.5))
    assert sample_loop_count(cfg, 4, 3, 0) == 2  # t(0) = min_loops: nothing else to draw
    late = [sample_loop_count(cfg, 4, 3, s) for s in range(800, 2800)]
    assert set(late) == set(range(2, 11))  # the whole range once the ramp is over


def test_ramp_mean_rises_monotonically_to_the_target():
    """Mean draw in consecutive windows of steps (many seeds): non-decreasing, ends at target."""
    cfg = LoopSamplingConfig(mode="poisson_lognormal", min_loops=1, max_loops=64, mean=6.0,
                             sigma=0.5, ramp_steps=400)
    windows = [np.mean([sample_loop_count(cfg, 4, seed, s) for seed in range(40)
                        for s in range(a, a + 100)]) for a in range(0, 600, 100)]
    assert all(b >= a - 0.05 for a, b in zip(windows, windows[1:], strict=False))
    assert windows[0] < 2.0 and abs(windows[-1] - 6.0) < 0.2
    expected = [np.mean([loop_target(cfg, 4, s) for s in range(a, a + 100)])
                for a in range(0, 600, 100)]
    assert np.allclose(windows, expected, atol=0.25)


def test_ramp_draw_is_a_pure_function_of_seed_and_step():
    cfg = LoopSamplingConfig(mode="uniform", min_loops=1, max_loops=16, ramp_steps=150)
    first = _draws(cfg, seed=3, steps=200)
    resumed = np.array([sample_loop_count(cfg, 4, 3, s) for s in range(120, 200)])
    assert np.array_equal(first[120:], resumed)


def test_gradient_loops_per_bptt_mode():
    assert gradient_loops(BpttConfig(mode="full", k=2), 5, 7, 3) == 5
    assert gradient_loops(BpttConfig(mode="unrolled", k=2), 5, 7, 3) == 5
    assert gradient_loops(BpttConfig(mode="truncated", k=2), 5, 7, 3) == 2
    assert gradient_loops(BpttConfig(mode="truncated", k=8), 5, 7, 3) == 5


def test_progressive_gradient_loops_are_uniform_below_k_and_loops():
    bptt = BpttConfig(mode="progressive", k=8)
    draws = np.array([gradient_loops(bptt, 16, 7, s) for s in range(4000)])
    assert draws.min() == 1 and draws.max() == 8
    counts = np.bincount(draws, minlength=9)[1:]
    assert counts.min() > 0.8 * 500 and counts.max() < 1.2 * 500  # 4000 / 8 each
    short = {gradient_loops(bptt, 3, 7, s) for s in range(500)}
    assert short == {1, 2, 3}  # never more than the loops run
    assert [gradient_loops(bptt, 16, 7, s) for s in range(50)] == list(draws[:50])  # pure
    assert [gradient_loops(bptt, 16, 8, s) for s in range(50)] != list(draws[:50])  # seeded
    # its own stream: not the loop count's draw of the same (seed, step)
    uniform = LoopSamplingConfig(mode="uniform", min_loops=1, max_loops=8)
    assert [sample_loop_count(uniform, 4, 7, s) for s in range(50)] != list(draws[:50])
