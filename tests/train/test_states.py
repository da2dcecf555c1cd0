"""The segment's stateful parts (the adapters the checkpoint path stores)."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.errors import CheckpointError
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.train.ema import WeightsEMA
from pipeline_lib.train.states import EMAPart, MoEBiases


def make_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**dict(vocab_size=48, d_model=16, n_heads=2, prelude_layers=1,
                                 core_layers=1, coda_layers=1, loops=2), **overrides})


def test_moe_biases_copy_must_agree_with_the_weights():
    model = LoopedLM(make_config(moe_experts=4, moe_top_k=2, moe_bias_update_rate=0.01))
    part = MoEBiases(model)
    saved = part.state_dict()
    assert saved and all(len(v) == 4 for v in saved.values())
    part.load_state_dict(saved)  # agrees: accepted
    name = next(iter(saved))
    with pytest.raises(CheckpointError, match=f"moe_biases\\['{name}'\\] disagrees"):
        part.load_state_dict({**saved, name: [1.0, 0.0, 0.0, 0.0]})


def test_ema_part_carries_weights_and_progress():
    model = LoopedLM(make_config())
    ema = WeightsEMA(model, 0.9)
    ema.update(model)
    state = EMAPart(ema).state_dict()
    assert state["updates"] == 1 and state["decay"] == 0.9
    other = EMAPart(WeightsEMA(LoopedLM(make_config()), 0.9))
    with torch.no_grad():
        for t in other.ema.shadow.values():
            t.zero_()
    other.load_state_dict(state)
    assert other.loaded and other.ema.num_updates == 1
    assert all(torch.equal(other.ema.state_dict()[k], v) for k, v in ema.state_dict().items())
