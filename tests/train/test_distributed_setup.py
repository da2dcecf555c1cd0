"""Process-group helpers that need no second process: torchrun detection, device checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_lib.errors import ConfigError
from pipeline_lib.train.distributed import (
    is_distributed,
    is_dtensor,
    launched_by_torchrun,
    process_device,
)
from pipeline_lib.train.ema import WeightsEMA


def test_torchrun_environment_is_detected() -> None:
    assert launched_by_torchrun({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert not launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "2"})
    assert not launched_by_torchrun({})


def test_several_ranks_need_a_process_group() -> None:
    assert not is_distributed()
    assert process_device("cpu", 1, 0) == torch.device("cpu")
    with pytest.raises(ConfigError, match="world size 2 needs a torch.distributed process group"):
        process_device("cpu", 2, 0)


def test_plain_tensors_are_not_sharded_and_the_ema_still_averages_them() -> None:
    model = nn.Linear(3, 2)
    assert not is_dtensor(model.weight)
    ema = WeightsEMA(model, 0.5)
    with torch.no_grad():
        model.weight.add_(2.0)
    ema.update(model)
    expected = model.weight.detach() - 1.0  # halfway between the old and the new weights
    assert torch.allclose(ema.state_dict()["weight"], expected)
