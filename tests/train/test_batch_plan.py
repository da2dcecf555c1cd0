"""Batch plan: global = micro × accumulation × world, validated, rows partitioned exactly."""

from __future__ import annotations

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.train.batch_plan import BatchPlan, make_batch_plan


def test_default_plan():
    plan = make_batch_plan(TrainConfig())
    assert plan == BatchPlan(global_batch_rows=16, micro_batch_rows=8, world_size=1, accum_steps=2)
    assert plan.tokens_per_step(128) == 2048


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ranks_and_micro_batches_make_up_the_global_batch(world):
    plan = make_batch_plan(TrainConfig(global_batch_rows=24, micro_batch_rows=3), world)
    assert plan.accum_steps * plan.micro_batch_rows * plan.world_size == 24


def test_world_size_other_than_nproc_keeps_global_batch():
    plan = make_batch_plan(TrainConfig(global_batch_rows=16, micro_batch_rows=4, nproc=1), 2)
    assert (plan.world_size, plan.accum_steps, plan.global_batch_rows) == (2, 2, 16)


def test_not_a_multiple_names_key_and_fix():
    with pytest.raises(ConfigError) as err:
        make_batch_plan(TrainConfig(global_batch_rows=20, micro_batch_rows=8))
    msg = str(err.value)
    assert "train.global_batch_rows = 20" in msg and "8 × 1" in msg
    assert "use train.global_batch_rows = 16 or 24" in msg


def test_too_small_global_batch_suggests_micro():
    with pytest.raises(ConfigError, match="lower train.micro_batch_rows to 2"):
        make_batch_plan(TrainConfig(global_batch_rows=4, micro_batch_rows=8), 2)
    with pytest.raises(ConfigError, match="raise train.global_batch_rows to 16"):
        make_batch_plan(TrainConfig(global_batch_rows=3, micro_batch_rows=8), 2)
    with pytest.raises(ConfigError, match="world size 0"):
        make_batch_plan(TrainConfig(), 0)
