"""Learning-rate multipliers: warmup, cosine, warmup–stable–decay, batch-size scaling."""

from __future__ import annotations

import math

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.train.schedule import LRSchedule, lr_multiplier, scale_lr


def cosine(step, total=100, warmup=10, min_lr=0.1):
    return lr_multiplier(step, total_steps=total, warmup_steps=warmup, schedule="cosine",
                         min_lr_ratio=min_lr)


def wsd(step, total=100, warmup=10, min_lr=0.1, decay=0.2):
    return lr_multiplier(step, total_steps=total, warmup_steps=warmup, schedule="wsd",
                         min_lr_ratio=min_lr, decay_fraction=decay)


def test_linear_warmup_reaches_peak_on_last_warmup_step():
    assert [cosine(s) for s in range(10)] == [(s + 1) / 10 for s in range(10)]
    assert cosine(9) == 1.0 and wsd(9) == 1.0
    assert cosine(0, warmup=0) == 1.0


def test_cosine_shape():
    assert cosine(10) == 1.0  # first step after warmup: peak
    assert cosine(99) == 0.1  # last step: the floor, exactly
    assert cosine(100) == 0.1 and cosine(10_000) == 0.1
    assert cosine(10, total=21, warmup=0) == pytest.approx(0.55, abs=1e-15)  # half way
    values = [cosine(s) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(values, values[1:], strict=False))
    s = 37  # formula check at an arbitrary step
    expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - 10) / 89))
    assert cosine(s) == pytest.approx(expected, abs=1e-15)


def test_wsd_shape():
    assert all(wsd(s) == 1.0 for s in range(9, 80))
    assert wsd(80) == pytest.approx(1 - 0.9 / 20, abs=1e-15)
    assert wsd(89) == pytest.approx(1 - 0.9 * 10 / 20, abs=1e-15)
    assert wsd(99) == pytest.approx(0.1, abs=1e-15)
    assert wsd(150) == pytest.approx(0.1, abs=1e-15)
    assert wsd(99, decay=0.0) == 1.0  # no decay phase configured
    # the decay phase never starts inside warmup
    assert [wsd(s, total=10, warmup=8, decay=0.5) for s in (7, 8, 9)] == \
        pytest.approx([1.0, 0.55, 0.1], abs=1e-15)


def test_unknown_schedule_is_a_config_error():
    with pytest.raises(ConfigError, match="train.schedule = 'linear'"):
        lr_multiplier(0, total_steps=10, warmup_steps=0, schedule="linear", min_lr_ratio=0.1)


def test_scale_lr():
    assert scale_lr(1e-3, 64, 16, "none") == 1e-3
    assert scale_lr(1e-3, 64, 16, "sqrt") == 2e-3
    assert scale_lr(1e-3, 64, 16, "linear") == 4e-3
    assert scale_lr(1e-3, 4, 16, "sqrt") == 5e-4
    with pytest.raises(ConfigError, match="train.lr_scaling"):
        scale_lr(1e-3, 64, 16, "cube")


def test_schedule_from_config_applies_per_group_peaks():
    train = TrainConfig(schedule="wsd", warmup_steps=4, min_lr_ratio=0.0, decay_fraction=0.5)
    sched = LRSchedule.from_config(train, total_steps=20)
    groups = [{"peak_lr": 1e-3, "lr": 0.0}, {"peak_lr": 5e-2, "lr": 0.0}]
    assert sched.apply(groups, 1) == 0.5
    assert [g["lr"] for g in groups] == [5e-4, 2.5e-2]
    assert sched.apply(groups, 19) == 0.0 and groups[1]["lr"] == 0.0
    assert sched.multiplier(5) == wsd(5, total=20, warmup=4, min_lr=0.0, decay=0.5)
