"""Spike guard decisions, per-key baselines, abort after consecutive skips, exact state."""

from __future__ import annotations

import json
import math

import pytest

from pipeline_lib.errors import CheckpointError, TrainingError
from pipeline_lib.spec.config_train import SpikeGuardConfig
from pipeline_lib.train.spike_guard import SpikeGuard


def guard_with(baseline: float, prev: float, count: int = 100, **cfg) -> SpikeGuard:
    g = SpikeGuard(SpikeGuardConfig(**{"warmup_steps": 5, **cfg}))
    g.load_state_dict({"version": 1, "baselines": {"0": {"ema": baseline, "prev": prev,
                                                         "count": count}},
                       "consecutive": 0, "skipped_total": 0, "step": None,
                       "step_skipped": False})
    return g


def one(g: SpikeGuard, loss: float, grad: float | None = 1.0, key="0", step=100):
    d = g.observe(step, loss, grad, key=key)
    g.end_step(step)
    return d


ISOLATE = {"ratio_jump": 1e9, "hard_jump": 1e9}


def test_relative_threshold_with_absolute_floor():
    # baseline 2: threshold = 2 + max(0.5, 0.5·2) = 3.0
    assert not one(guard_with(2.0, 2.0, **ISOLATE), 3.0).skip
    d = one(guard_with(2.0, 2.0, **ISOLATE), 3.0000001)
    assert d.skip and d.reason == "loss_spike" and d.event["threshold"] == 3.0
    # baseline 0.4: 1.5·0.4 = 0.6 would flag 0.85, but the 0.5-nat floor keeps it (0.9)
    assert not one(guard_with(0.4, 0.4, **ISOLATE), 0.85).skip
    assert one(guard_with(0.4, 0.4, **ISOLATE), 0.91).reason == "loss_spike"


def test_ratio_and_hard_jumps_against_previous_loss():
    loose = {"rel_threshold": 100.0}  # the loss_spike threshold out of reach
    g = guard_with(1.0, 1.0, ratio_jump=2.0, hard_jump=1e9, **loose)
    assert not one(g, 2.0).skip
    assert one(guard_with(1.0, 1.0, ratio_jump=2.0, hard_jump=1e9, **loose), 2.01).reason == \
        "ratio_jump"
    d = one(guard_with(3.0, 3.0, ratio_jump=1e9, hard_jump=1.0, **loose), 4.5)
    assert d.reason == "hard_jump" and d.event["reasons"] == ["hard_jump"]
    d = one(guard_with(1.0, 1.0), 9.0)  # default thresholds: all three fire, first is reported
    assert d.event["reasons"] == ["loss_spike", "ratio_jump", "hard_jump"]


def test_a_ratio_jump_near_zero_loss_is_no_spike():
    """A learned task's loss moving 0.004 → 0.015 is 3.75× but 0.011 nats: noise, not a spike
    (the floor delta_floor applies to ratio jumps as to loss spikes)."""
    assert not one(guard_with(0.004, 0.004), 0.015).skip
    assert one(guard_with(0.004, 0.004, delta_floor=0.01, rel_threshold=100.0),
               0.015).reason == "ratio_jump"


def test_non_finite_loss_and_grad_are_skipped_even_in_warmup():
    g = SpikeGuard(SpikeGuardConfig(warmup_steps=100))
    assert not one(g, 5.0, step=0).skip
    assert one(g, 500.0, step=1).skip is False  # warmup: spikes pass
    d = one(g, float("nan"), step=2)
    assert d.reason == "non_finite_loss"
    assert json.loads(json.dumps(d.event, allow_nan=False))["loss"] == "nan"
    d = one(g, 5.0, float("inf"), step=3)
    assert d.reason == "non_finite_grad" and d.event["grad_norm"] == "inf"


def test_baseline_updates_only_on_accepted_losses():
    g = guard_with(2.0, 2.0, ema_beta=0.9)
    one(g, 2.5)
    assert g.baselines["0"] == {"ema": 0.9 * 2.0 + 0.1 * 2.5, "prev": 2.5, "count": 101}
    before = json.dumps(g.state_dict()["baselines"])
    assert one(g, 50.0).skip
    assert json.dumps(g.state_dict()["baselines"]) == before


def test_warmup_is_per_key_and_first_loss_starts_the_baseline():
    g = SpikeGuard(SpikeGuardConfig(warmup_steps=2))
    for step, loss in enumerate([4.0, 4.0]):
        assert not one(g, loss, step=step).skip
    assert one(g, 40.0, step=2).skip  # key 0 settled
    d = g.observe(3, 4.0, key="0")
    assert not d.skip and not g.observe(3, 40.0, key=1).skip  # key "1" is new: in warmup
    g.end_step(3)
    assert g.baselines["1"] == {"ema": 40.0, "prev": 40.0, "count": 1}


def test_one_spiking_segment_skips_the_global_step():
    g = SpikeGuard(SpikeGuardConfig(warmup_steps=0))
    for step in range(3):
        g.observe(step, 2.0, key=0)
        g.observe(step, 1.0, key=1)
        assert g.end_step(step) is False
    assert not g.observe(3, 2.0, key=0).skip
    assert g.observe(3, 9.0, key=1).skip
    assert g.step_skipped
    assert g.end_step(3) is True and g.consecutive == 1 and g.skipped_total == 1


def test_abort_after_consecutive_skips_names_last_good_snapshot():
    events = []
    g = SpikeGuard(SpikeGuardConfig(warmup_steps=0, abort_consecutive=3),
                   last_good_snapshot="results/r/snapshots/step_0000100", event_sink=events.append)
    one(g, 2.0, step=100)
    assert one(g, float("nan"), step=101).skip and g.consecutive == 1
    assert one(g, float("nan"), step=102).skip and g.consecutive == 2
    assert not one(g, 2.0, step=103).skip and g.consecutive == 0  # an accepted step resets
    one(g, float("nan"), step=104)
    one(g, 99.0, step=105)
    with pytest.raises(TrainingError) as err:
        one(g, float("inf"), step=106)
    msg = str(err.value)
    assert "step 106" in msg and "3 consecutive" in msg and "abort_consecutive = 3" in msg
    assert "results/r/snapshots/step_0000100" in msg and "\n" not in msg
    assert [e["event"] for e in events] == ["skip"] * 5 + ["abort"]
    assert [e["step"] for e in events] == [101, 102, 104, 105, 106, 106]
    assert [e["consecutive"] for e in events[2:5]] == [1, 2, 3]
    assert events[-1]["last_good_snapshot"] == "results/r/snapshots/step_0000100"
    for e in events:
        json.dumps(e, allow_nan=False)


def test_state_round_trip_gives_identical_decisions():
    cfg = SpikeGuardConfig(warmup_steps=3, abort_consecutive=100)
    losses = [3.0, 2.9, 2.8, 2.7, 9.0, 2.6, float("nan"), 2.5, 2.45, 7.0, 2.4, 2.35, 2.3]

    def run(g, seq, start):
        out = []
        for i, loss in enumerate(seq, start):
            out.append((g.observe(i, loss, key=i % 2).skip, g.observe(i, loss / 2, key="x").skip))
            g.end_step(i)
        return out

    ref = SpikeGuard(cfg)
    expected = run(ref, losses, 0)
    a = SpikeGuard(cfg)
    first = run(a, losses[:6], 0)
    b = SpikeGuard(cfg)
    b.load_state_dict(json.loads(json.dumps(a.state_dict(), allow_nan=False)))
    assert first + run(b, losses[6:], 6) == expected
    assert b.state_dict() == ref.state_dict()
    assert any(skip for pair in expected for skip in pair)


def test_disabled_guard_accepts_everything_silently():
    events = []
    g = SpikeGuard(SpikeGuardConfig(enabled=False, abort_consecutive=1), event_sink=events.append)
    for step in range(3):
        assert not g.observe(step, math.nan, math.nan).skip
        assert g.end_step(step) is False
    assert events == []


def test_record_and_bad_state():
    events = []
    g = SpikeGuard(SpikeGuardConfig(), event_sink=events.append)
    ev = g.record("rollback", 100, skip_steps=10, snapshot="s")
    assert events == [ev] == [{"event": "rollback", "step": 100, "skip_steps": 10, "snapshot": "s"}]
    with pytest.raises(CheckpointError, match="version"):
        g.load_state_dict({"version": 7})
    with pytest.raises(CheckpointError, match="malformed"):
        g.load_state_dict({"version": 1, "baselines": {"0": {"ema": 1.0}}})
