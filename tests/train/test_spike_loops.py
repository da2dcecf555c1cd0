"""The spike guard under sampled loop counts (issue 30): a model trained at one loop, then
trained at 1–4 sampled loops, reads out far worse after 2–4 loops than after 1 (the
retrofit situation: near its original at 1 loop). Each loop count keeps its own baseline,
so the steps that train the extra loops are not taken for spikes; one baseline shared by
every count would have skipped them."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainer_helpers import events, make_pack, metrics, snap, tiny_config

from pipeline_lib.train.job import train_segment
from pipeline_lib.train.spike_guard import SpikeGuard

# the whole model is the core (as an import of every layer): extra loops move it far
WHOLE_CORE = ["model.d_model=64", "model.prelude_layers=0", "model.coda_layers=0",
              "train.objective=last", "train.eval_interval=1000", "train.sample_tokens=0",
              "train.diagnostics_interval=0"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


def test_deeper_sampled_loops_of_a_one_loop_model_are_not_spikes(pack: Path,
                                                                  tmp_path: Path) -> None:
    pre = tiny_config(*WHOLE_CORE, "model.loops=1", "train.total_steps=150",
                      "train.steps_per_segment=150", "train.lr=0.01", "train.spike.enabled=false")
    start = train_segment(pre, pack, None, 150, snap(tmp_path / "pre", 150))
    cfg = tiny_config(*WHOLE_CORE, "model.loops=4", "train.total_steps=16",
                      "train.steps_per_segment=16", "train.lr=3e-4",
                      "train.loop_sampling.mode=uniform", "train.loop_sampling.max_loops=4")
    assert cfg.train.spike.warmup_steps == 2  # each count is judged from its third loss on
    train_segment(cfg, pack, None, 16, snap(tmp_path / "sampled", 16), warm_start=start)
    lines = metrics(tmp_path / "sampled")
    assert events(tmp_path / "sampled") == [] and not any(m["skipped"] for m in lines)
    assert {m["loops"] for m in lines} == {1, 2, 3, 4}
    # the same losses judged against one baseline for every count: the deeper ones spike
    shared, spikes = SpikeGuard(cfg.train.spike), []
    for m in lines:
        if shared.observe(m["step"], m["loss"], key="all").skip:
            spikes.append(m["loops"])
        shared.end_step(m["step"])
    assert len(spikes) >= 3 and min(spikes) >= 2
