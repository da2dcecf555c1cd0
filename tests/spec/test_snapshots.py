"""Retention policy: step counts, segment ends, kept vs temporary snapshots (torch-free)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.budget import total_steps
from pipeline_lib.spec.config import SnapshotsConfig
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.spec.layout import step_dir_name
from pipeline_lib.spec.size import param_count
from pipeline_lib.spec.snapshots import (
    ANCHOR_SEGMENTS,
    anchor_steps,
    kept_steps,
    previous_end,
    segment_ends,
)


def test_total_steps_explicit_wins():
    assert total_steps(TrainConfig(total_steps=300), ModelConfig(), 128, 260) == 300


def test_total_steps_from_token_budget():
    model = ModelConfig(d_model=64, n_heads=4)
    train = TrainConfig(total_steps=0, token_budget_multiplier=20.0, global_batch_rows=16)
    params = param_count(ModelConfig(d_model=64, n_heads=4, vocab_size=260))
    expected = math.ceil(params * 20.0 / (128 * 16))
    assert total_steps(train, model, 128, 260) == expected
    # model.vocab_size, when set, is the one counted
    params_v = param_count(ModelConfig(d_model=64, n_heads=4, vocab_size=1000))
    assert total_steps(train, ModelConfig(d_model=64, n_heads=4, vocab_size=1000), 128, 260) == \
        math.ceil(params_v * 20.0 / (128 * 16))
    tiny = TrainConfig(total_steps=0, token_budget_multiplier=1e-9)
    assert total_steps(tiny, model, 128, 260) == 1
    with pytest.raises(ConfigError, match="vocab_size is 0"):
        total_steps(train, model, 128, 0)


def test_segment_ends():
    assert segment_ends(300, 100) == [100, 200, 300]
    assert segment_ends(250, 100) == [100, 200, 250]
    assert segment_ends(50, 100) == [50]
    assert segment_ends(1, 1) == [1]
    with pytest.raises(ConfigError, match="total_steps = 0"):
        segment_ends(0, 10)


def test_kept_steps_follow_the_policy():
    ends = segment_ends(1000, 100)
    snap = SnapshotsConfig(keep_last=2, keep_every=300)
    assert kept_steps(ends, snap) == [300, 600, 900, 1000]
    assert kept_steps(ends, SnapshotsConfig(keep_last=1)) == [1000]
    assert kept_steps(ends, SnapshotsConfig(keep_last=3)) == [800, 900, 1000]
    assert kept_steps([50], SnapshotsConfig(keep_last=5, keep_every=7)) == [50]
    # the final one is kept even when keep_every does not divide it
    assert kept_steps(segment_ends(250, 100), SnapshotsConfig(keep_last=1, keep_every=100)) == \
        [100, 200, 250]


def test_anchors_break_long_temporary_chains_only():
    ends = segment_ends(100, 10)  # 10 segments
    # kept: the final one; 9 temporary segments before it → an anchor every 4th
    assert anchor_steps(ends, [100], every=4) == [40, 80]
    # kept snapshots reset the count: 20 and 70 kept leave runs of 1, 4 and 3
    assert anchor_steps(ends, [20, 70, 100], every=4) == [60]
    assert anchor_steps(ends, kept_steps(ends, SnapshotsConfig(keep_every=30)), every=4) == []
    assert anchor_steps(ends, [100]) == []  # far below the default spacing
    with pytest.raises(ValueError, match="at least 1"):
        anchor_steps(ends, [100], every=0)


@pytest.mark.parametrize("keep_last, keep_every", [(1, 0), (3, 0), (1, 10), (2, 7770),
                                                  (1, 149_990)])
def test_no_target_is_more_than_the_anchor_spacing_behind_the_previous(keep_last, keep_every):
    """The property planning relies on, for 5000 segments and any keep policy: between two
    consecutive targets (kept or anchor, in step order) lie at most ANCHOR_SEGMENTS - 1
    temporary segments, so Snakemake never resolves a chain longer than ANCHOR_SEGMENTS."""
    ends = segment_ends(50_000, 10)
    kept = kept_steps(ends, SnapshotsConfig(keep_last=keep_last, keep_every=keep_every))
    anchors = anchor_steps(ends, kept)
    assert not set(anchors) & set(kept)
    position = {step: i for i, step in enumerate(ends)}
    at = [-1] + [position[step] for step in sorted({*kept, *anchors})]  # -1: before the first
    assert max(b - a for a, b in itertools.pairwise(at)) <= ANCHOR_SEGMENTS
    assert at[-1] == len(ends) - 1


def test_previous_end_and_names():
    ends = [100, 200, 250]
    assert [previous_end(ends, s) for s in ends] == [None, 100, 200]
    with pytest.raises(ConfigError, match="not a segment end"):
        previous_end(ends, 150)
    assert step_dir_name(250) == "step_0000250"


def test_module_is_torch_free():
    code = ("import sys, pipeline_lib.spec.budget as p, pipeline_lib.spec.config_train as t,"
            " pipeline_lib.spec.config_model as m;"
            "p.total_steps(t.TrainConfig(total_steps=0), m.ModelConfig(), 128, 260);"
            "import pipeline_lib.checkpoint.best, pipeline_lib.checkpoint.manifest;"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
