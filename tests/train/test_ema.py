"""Weights EMA: exact blend, buffers copied, ties kept, state round trip."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline_lib.errors import CheckpointError, ConfigError
from pipeline_lib.train.ema import WeightsEMA


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.out = nn.Linear(3, 5, bias=False)
        self.out.weight = self.emb.weight
        self.lin = nn.Linear(3, 3)
        self.register_buffer("bias_balance", torch.zeros(3))
        self.register_buffer("counts", torch.zeros(3, dtype=torch.int64))


def _bump(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
        model.bias_balance.fill_(value)
        model.counts.fill_(int(value))


def test_blend_and_buffers_are_copied():
    torch.manual_seed(0)
    model = Tied().double()
    ema = WeightsEMA(model, decay=0.75)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _bump(model, 2.0)
    ema.update(model)
    sd = ema.state_dict()
    for key in ("emb.weight", "lin.weight", "lin.bias"):
        torch.testing.assert_close(sd[key], 0.75 * start[key] + 0.25 * 2.0, rtol=0, atol=1e-15)
    assert torch.equal(sd["bias_balance"], torch.full((3,), 2.0, dtype=torch.float64))
    assert torch.equal(sd["counts"], torch.full((3,), 2))
    assert ema.num_updates == 1


def test_keys_match_model_and_ties_survive():
    model = Tied()
    ema = WeightsEMA(model, decay=0.9)
    sd = ema.state_dict()
    assert list(sd) == list(model.state_dict())
    assert sd["out.weight"] is sd["emb.weight"]
    _bump(model, 1.0)
    ema.update(model)
    assert sd["out.weight"] is ema.state_dict()["emb.weight"]
    assert not any(t is p for t in sd.values() for p in model.parameters())


def test_state_round_trip_and_copy_to():
    model = Tied()
    ema = WeightsEMA(model, decay=0.5)
    _bump(model, 3.0)
    ema.update(model)
    other = WeightsEMA(Tied(), decay=0.5)
    other.load_state_dict({k: v.clone() for k, v in ema.state_dict().items()})
    for k, v in ema.state_dict().items():
        assert torch.equal(other.state_dict()[k], v)


def test_errors():
    with pytest.raises(ConfigError, match="train.ema_decay = 1.0"):
        WeightsEMA(Tied(), decay=1.0)
    ema = WeightsEMA(Tied(), decay=0.9)
    with pytest.raises(CheckpointError, match="missing"):
        ema.load_state_dict({"emb.weight": torch.zeros(5, 3)})
    bad = {k: v.clone() for k, v in ema.state_dict().items()}
    bad["lin.weight"] = torch.zeros(4, 3)
    with pytest.raises(CheckpointError, match="lin.weight has shape"):
        ema.load_state_dict(bad)
