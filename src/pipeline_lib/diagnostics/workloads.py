"""The ~125M-parameter looped model of the throughput and evaluation checks: its config, its
pack (long stdlib sources and short reasoning documents) and its one training run, shared
by ``train_throughput``, ``heff_sweep``, ``lm_eval`` and ``kv_cache``."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..data.sources import stdlib_files
from ..spec.config import Config, DataConfig, SourceConfig
from ..spec.config_load import load_config
from ..spec.layout import RunLayout
from ..train.job import train_segment
from .core import Context
from .training import metrics

RUN = ["train.objective=last", "train.warmup_steps=4", "train.eval_interval=0",
       "train.eval_rows=4", "train.diagnostics_interval=0", "train.sample_tokens=8",
       "train.deterministic=false", "train.nproc=1", "train.nnodes=1", "tracking.enabled=false"]


@dataclass
class TrainedModel:
    """The throughput run: its config, pack, final snapshot and per-step metrics."""

    cfg: Config
    pack: Path
    snapshot: Path
    rows: list[dict[str, Any]]
    segment: dict[str, Any]


def model_config(ctx: Context) -> Config:
    """The model of ``sizes.model`` on the checks' device, precision, attention and compile,
    trained ``sizes.steps`` steps on ``sizes.rows`` rows of ``sizes.seq_len`` tokens."""

    s, base = ctx.sizes, ctx.cfg
    keep = [f"experiment.device={base.experiment.device}",
            f"experiment.precision={base.experiment.precision}",
            f"model.attention={base.model.attention}",
            f"train.compile={str(base.train.compile).lower()}"]
    steps = [f"train.total_steps={s.steps}", f"train.steps_per_segment={s.steps}",
             f"train.global_batch_rows={s.rows}", f"train.micro_batch_rows={s.micro_rows}",
             f"train.spike.warmup_steps={s.steps}"]
    cfg = load_config(None, [*s.model, *RUN, *steps, *keep])
    sources = [SourceConfig(type="reasoning", num_docs=s.pack_docs, max_difficulty=4, seed=2)]
    if s.stdlib_docs and stdlib_files():  # long documents: attention spans whole rows
        sources.insert(0, SourceConfig(type="stdlib", max_docs=s.stdlib_docs))
    data = DataConfig(sources=sources, seq_len=s.seq_len, epochs=1, val_fraction=0.1, seed=4)
    return dataclasses.replace(cfg, data=data)


def trained_model(ctx: Context) -> TrainedModel:
    """The throughput run, trained once per run of the checks (in ``work/model``)."""
    if "model" not in ctx.cache:

        cfg = model_config(ctx)
        pack = ctx.pack(cfg.data, "data_model")
        out = RunLayout.at(ctx.work / "model").snapshot(cfg.train.total_steps)
        if not out.exists():
            train_segment(cfg, pack, None, cfg.train.total_steps, out)
        segment = json.loads((out / "trainer_state.json").read_text())["segments"][-1]
        ctx.cache["model"] = TrainedModel(cfg, pack, out, metrics(out.parents[1]), segment)
    return ctx.cache["model"]
