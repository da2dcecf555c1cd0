"""The parent run's ``train`` headline group: size and cost of the finished run."""

from __future__ import annotations

import dataclasses

from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.size import flops_per_token, param_count
from pipeline_lib.workflow.stages.train import train_values


def test_train_values_sum_segment_wall_times_at_step_zero() -> None:
    model = dataclasses.replace(ModelConfig(), vocab_size=258, d_model=32, n_heads=2, loops=4)
    segments = [{"wall_before_save_s": 12.5, "step_time_s": 10.0},
                {"wall_before_save_s": 7.25}, {"start_step": 20}]
    values = train_values(model, 64, 15360, segments)
    assert values == {"model/params": {0: float(param_count(model))},
                      "model/flops_per_token": {0: float(flops_per_token(model, 64))},
                      "train/tokens_seen": {0: 15360.0}, "train/wall_time_s": {0: 19.75}}
    assert flops_per_token(model, 64) > flops_per_token(dataclasses.replace(model, loops=1), 64)
