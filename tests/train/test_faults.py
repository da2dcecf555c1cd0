"""The test-support fault plan (LOOPLINE_FAULT_INJECT): inert when unset, parsed strictly,
perturbs only what it names."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from support.faults import FAULT_ENV, FaultPlan

from pipeline_lib.errors import ConfigError


def test_unset_is_inert() -> None:
    plan = FaultPlan.from_env({})
    assert not plan.active
    loss = torch.tensor(2.5)
    assert plan.perturb_loss(loss, 3, 0) is loss
    plan.maybe_pause(3)  # returns at once


def test_nan_step_and_spike_rows() -> None:
    plan = FaultPlan.from_env({FAULT_ENV: "nan_step=3, spike_rows=16:32, spike_nats=7"})
    assert plan.active and plan.spike_rows == (16, 32)
    w = torch.tensor(1.5, requires_grad=True)
    nan_loss = plan.perturb_loss(w * 2, 3, 0)
    nan_loss.backward()
    assert math.isnan(float(nan_loss.detach())) and math.isnan(float(w.grad))
    assert float(plan.perturb_loss(torch.tensor(2.0), 4, 16)) == 9.0
    assert float(plan.perturb_loss(torch.tensor(2.0), 4, 31)) == 9.0
    assert float(plan.perturb_loss(torch.tensor(2.0), 4, 32)) == 2.0
    assert float(plan.perturb_loss(torch.tensor(2.0), 4, 15)) == 2.0


def test_pause_touches_its_file(tmp_path: Path) -> None:
    marker = tmp_path / "sub" / "paused"
    plan = FaultPlan.from_env({FAULT_ENV: f"pause_step=2,pause_s=0,pause_file={marker}"})
    plan.maybe_pause(1)
    assert not marker.exists()
    plan.maybe_pause(2)
    assert marker.read_text() == "2\n"


def test_a_pause_range_pauses_every_step_in_it(tmp_path: Path) -> None:
    marker = tmp_path / "paused"
    plan = FaultPlan.from_env({FAULT_ENV: f"pause_step=2:3,pause_s=0,pause_file={marker}"})
    for step in range(1, 5):
        plan.maybe_pause(step)
        if step in (2, 3):
            assert marker.read_text() == f"{step}\n"
            marker.unlink()
        else:
            assert not marker.exists()


@pytest.mark.parametrize("text", ["nan_step", "bogus=1", "nan_step=x", "spike_rows=a:b"])
def test_malformed_values_name_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match=FAULT_ENV):
        FaultPlan.from_env({FAULT_ENV: text})
