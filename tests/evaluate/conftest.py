"""A tiny packed corpus and a snapshot of a small (untrained) looped model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline_lib.checkpoint.rng import capture_rng_state
from pipeline_lib.checkpoint.snapshot import write_snapshot
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.spec.config import Config, DataConfig, SourceConfig
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_write import save_config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(data_dir, snapshot_dir) with a 2-loop model whose weights are seeded, not trained."""
    root = tmp_path_factory.mktemp("heff")
    data = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=300, seed=7)],
                      seq_len=32, epochs=1, val_fraction=0.3, seed=1)
    meta = pack_corpus(data, root / "data")
    from pipeline_lib.model.looped import LoopedLM

    cfg = Config(data=data, model=ModelConfig(vocab_size=meta["vocab_size"], d_model=32,
                                              n_heads=2, loops=2, init_std=0.1))
    torch.manual_seed(0)
    model = LoopedLM(cfg.model)
    save_config(cfg, root / "config.yaml")
    snap = write_snapshot(
        root / "results" / "r" / "snapshots" / "step_0000007",
        model_state=model.state_dict(),
        optimizer_state=torch.optim.AdamW(model.parameters()).state_dict(),
        trainer_state={"step": 7},
        rng_state=capture_rng_state(),
        config_yaml=(root / "config.yaml").read_text(),
        extra_files={"tokenizer.json": (root / "data" / "tokenizer.json").read_text()},
    )
    return root / "data", snap
