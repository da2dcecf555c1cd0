"""Tiny packs and configs for the trainer tests (d_model 32, 2 heads, seq_len 32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from support.faults import FAULTY_TRAIN

from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.spec.config import Config, DataConfig, SourceConfig
from pipeline_lib.spec.config_load import load_config

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DATA = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=200, max_difficulty=3, seed=1)],
                  seq_len=32, epochs=2, val_fraction=0.1, seed=3)
BASE = ["model.d_model=32", "model.n_heads=2", "model.loops=3", "data.seq_len=32",
        "train.total_steps=6", "train.global_batch_rows=8", "train.micro_batch_rows=4",
        "train.warmup_steps=2", "train.eval_interval=4", "train.eval_rows=8",
        "train.diagnostics_interval=3", "train.sample_tokens=4", "train.steps_per_segment=2",
        "tracking.enabled=false", "experiment.device=cpu", "train.spike.warmup_steps=2",
        "train.objective=deep_supervision"]  # every token scored, whatever the default
RICH = ["model.moe_experts=4", "model.moe_top_k=2", "train.loop_sampling.mode=uniform",
        "train.loop_sampling.min_loops=1", "train.loop_sampling.max_loops=5",
        "train.bptt.mode=unrolled", "train.bptt.k=2", "train.ema_decay=0.9",
        "model.learn_injection_scale=true", "train.answer_weight=2.0"]


def make_pack(out: Path) -> Path:
    pack_corpus(DATA, out)
    return out


def uninterrupted_run(pack: Path, run: Path, *overrides: str) -> Path:
    """The reference of the fault tests: segments 0 → 3 → 6 in this process (the tiny config
    with ``overrides``); ``run``."""
    from pipeline_lib.train.job import train_segment

    train_segment(tiny_config(*overrides), pack, None, 3, snap(run, 3))
    train_segment(tiny_config(*overrides), pack, snap(run, 3), 6, snap(run, 6))
    return run


def tiny_config(*overrides: str) -> Config:
    cfg = load_config(None, [*BASE, *overrides])
    return replace(cfg, data=DATA)


def config_file(path: Path, *overrides: str) -> Path:
    """The tiny config as a YAML file (for CLI runs in a subprocess)."""
    from pipeline_lib.spec.config_write import config_yaml

    path.write_text(config_yaml(tiny_config(*overrides)))
    return path


def snap(run: Path, step: int) -> Path:
    return run / "snapshots" / f"step_{step:07d}"


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]


def events(run: Path) -> list[dict[str, Any]]:
    path = run / "train" / "spike_events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def weights(snapshot: Path, name: str = "model.safetensors") -> dict:
    return load_file(str(snapshot / name))


def cli(args: list[str], env: dict[str, str] | None = None, *, faulty: bool = False,
        **popen: Any) -> subprocess.Popen:
    """``python -m pipeline_lib train …`` in a subprocess with one thread; ``faulty``: through
    ``tests/support/faulty_train.py``, which installs the faults ``env`` names first."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT_ROOT / "src"),
                **(env or {})}
    entry = [str(FAULTY_TRAIN)] if faulty else ["-m", "pipeline_lib"]
    return subprocess.Popen([sys.executable, *entry, "train", *args],
                            env=full_env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)
