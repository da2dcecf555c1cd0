"""A segment's set-up and state: what a snapshot restores and what the next one saves.

:func:`build_model` seeds and builds the model, :func:`set_determinism` picks kernels;
:class:`TrainerState` is the part of the training state that is not a tensor (it becomes
``trainer_state.json``); :func:`restore_snapshot` verifies a snapshot, checks that the
current config may resume it exactly, and loads model, optimizer, guard, EMA and RNG
streams; :func:`snapshot_contents` gathers everything :func:`write_snapshot` needs.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint.compat import check_resume_compatible, config_from_yaml
from ..checkpoint.contents import Snapshot
from ..checkpoint.rng import capture_rng_state, restore_rng_state
from ..checkpoint.snapshot import load_snapshot
from ..config import Config, config_yaml
from ..data.loader import DataCursor, PackedData
from ..errors import CheckpointError, ConfigError, DataError
from ..model.looped import LoopedLM
from .distributed import RankGroup
from .ema import WeightsEMA
from .optim import load_optimizer_state, refresh_group_hparams
from .spike_guard import SpikeGuard, json_float

log = logging.getLogger(__name__)

STATE_FORMAT = 1


@dataclass
class TrainerState:
    """Counters and records carried from segment to segment (``trainer_state.json``)."""

    step: int = 0  # optimizer (global) steps done; the next step is step + 1
    tokens_seen: int = 0  # input tokens consumed, skipped steps included
    cursor: DataCursor = field(default_factory=DataCursor)  # next row of the data stream
    optimizer_steps: int = 0  # optimizer.step() calls (segmented backprop: several per step)
    tracking_run_id: str | None = None  # the MLflow child run all segments continue
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    val_loss: float | None = None  # at this snapshot's step
    best_val: dict[str, Any] | None = None  # {"step", "val_loss"}: lowest so far
    last_loops: int | None = None
    lr: dict[str, float] = field(default_factory=dict)  # per group, at the last step
    segments: list[dict[str, Any]] = field(default_factory=list)  # one record per segment
    warm_start: dict[str, Any] | None = None  # weights-only start this run began from

    def to_json(self, *, guard: SpikeGuard, ema: WeightsEMA | None, cfg: Config,
                total_steps: int, moe_biases: dict[str, list[float]]) -> dict[str, Any]:
        ls = cfg.train.loop_sampling
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "total_steps": total_steps,
            "tokens_seen": self.tokens_seen,
            "cursor": self.cursor.to_json(),
            "optimizer_steps": self.optimizer_steps,
            "lr": self.lr,
            "spike_guard": guard.state_dict(),
            "loop_sampling": {"rule": "sample_loop_count(seed, step)",
                              "seed": cfg.experiment.seed, "mode": ls.mode,
                              "min_loops": ls.min_loops, "max_loops": ls.max_loops,
                              "ramp_steps": ls.ramp_steps, "last_loops": self.last_loops},
            "moe_biases": moe_biases,  # a readable copy; the buffers are in the model weights
            "ema": None if ema is None else {"decay": ema.decay, "updates": ema.num_updates},
            "tracking_run_id": self.tracking_run_id,
            "rollbacks": self.rollbacks,
            "val_loss": json_float(self.val_loss),
            "best_val": self.best_val,
            "segments": self.segments,
            "warm_start": self.warm_start,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any], source: str) -> TrainerState:
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
            raise CheckpointError(f"{source} has trainer-state format "
                                  f"{doc.get('format') if isinstance(doc, dict) else None!r}, "
                                  f"this code reads {STATE_FORMAT}; resume with the version "
                                  "that wrote it or warm-start the weights")
        try:
            val = doc.get("val_loss")
            return cls(step=int(doc["step"]), tokens_seen=int(doc["tokens_seen"]),
                       cursor=DataCursor.from_json(doc["cursor"]),
                       optimizer_steps=int(doc.get("optimizer_steps", 0)),
                       tracking_run_id=doc.get("tracking_run_id"),
                       rollbacks=list(doc.get("rollbacks") or []),
                       val_loss=None if val is None else float(val),
                       best_val=doc.get("best_val"), last_loops=doc["loop_sampling"]["last_loops"],
                       lr=dict(doc.get("lr") or {}), segments=list(doc.get("segments") or []),
                       warm_start=doc.get("warm_start"))
        except (KeyError, TypeError, ValueError, DataError) as exc:
            raise CheckpointError(f"{source} is malformed ({exc!r}); the snapshot is corrupted, "
                                  "resume from another one") from None


def set_determinism(enabled: bool, device: torch.device, *, compiled: bool = False) -> None:
    """Deterministic kernels (exact on the CPU; accelerators warn where none exists)."""
    if enabled and device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    warn_only = device.type != "cpu"
    if compiled:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
    else:
        # The public call also sets torch._inductor.config.deterministic, and importing
        # inductor costs seconds of segment start-up; eager mode needs only this flag.
        torch._C._set_deterministic_algorithms(enabled, warn_only=warn_only)


def build_model(cfg: Config, device: torch.device) -> LoopedLM:
    """The model, initialised from ``experiment.seed`` (on the CPU, then moved)."""
    seed = cfg.experiment.seed
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return LoopedLM(cfg.model).to(device)


def resolve_config(cfg: Config, data: PackedData) -> Config:
    """``cfg`` with ``model.vocab_size`` taken from the pack when 0; the pack's sequence
    length must be ``data.seq_len``, and an answer_* objective needs answer spans."""
    if data.seq_len != cfg.data.seq_len:
        raise DataError(f"data directory {data.data_dir} is packed with seq_len {data.seq_len}, "
                        f"config data.seq_len is {cfg.data.seq_len}; pass the data directory "
                        "of this config (results/data/<data_id>) or re-pack")
    if cfg.train.objective.startswith("answer_") and not data.has_answer_spans:
        raise ConfigError(f"train.objective = {cfg.train.objective} scores answer tokens only, "
                          f"but the pack {data.data_dir} has no answer spans; add a reasoning "
                          "source or prompt_field/answer_field to a data source, or use "
                          "train.objective last or deep_supervision")
    vocab = cfg.model.vocab_size or data.vocab_size
    if vocab < data.vocab_size:
        raise DataError(f"model.vocab_size = {vocab} is smaller than the tokenizer's "
                        f"{data.vocab_size} ids in {data.data_dir}; set model.vocab_size: 0")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))


def moe_biases(model: torch.nn.Module) -> dict[str, list[float]]:
    return {name: [float(b) for b in layer.balance_bias] for name, layer in model.moe_layers()}


def _load_agreed(path: Path, device: torch.device, group: RankGroup | None) -> Snapshot:
    """``load_snapshot``; with several ranks, rank 0 hashes every file, the others check
    sizes only, and all ranks raise together when any refuses."""
    if group is None:
        return load_snapshot(path, map_location=device)
    error: CheckpointError | None = None
    try:
        snap = load_snapshot(path, map_location=device, rank=group.rank, consolidate=False,
                             hash_files=None if group.rank == 0 else [])
    except CheckpointError as exc:
        error = exc
    if group.any(error is not None):
        raise error or CheckpointError(f"snapshot {path} was refused on another rank (see "
                                       "rank 0's error); resume from another snapshot")
    return snap


def restore_snapshot(path: Path, cfg: Config, *, model: torch.nn.Module,
                     optimizer: torch.optim.Optimizer, guard: SpikeGuard,
                     ema: WeightsEMA | None, device: torch.device,
                     group: RankGroup | None = None) -> TrainerState:
    """Load snapshot ``path`` into the freshly built parts; returns its trainer state.

    Refuses (CheckpointError) a damaged snapshot (the manifest check names the file) and a
    config that changed in a key exact resume depends on (listing the keys). With a
    ``group`` (several ranks, sharded model) a sharded snapshot is loaded through DCP,
    resharded to this world size, and an unsharded one is cut into shards; one process
    reads either kind (a sharded one consolidated).
    """
    snap = _load_agreed(path, device, group)
    snap_cfg = config_from_yaml(snap.config_yaml, str(path / "config.yaml"))
    check_resume_compatible(snap_cfg, cfg, source=path)
    if group is not None:
        from .sharded_state import load_full_into, load_sharded_into

        (load_sharded_into if snap.sharded else load_full_into)(snap, model, optimizer, ema)
        refresh_group_hparams(optimizer, cfg.train)
        return _restore_rest(snap, path, guard)
    missing, unexpected = model.load_state_dict(snap.model_state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"the weights of {path} do not fit the model (missing "
                              f"{missing[:6]}, unexpected {unexpected[:6]}); resume with the "
                              "snapshot's model config")
    load_optimizer_state(optimizer, snap.optimizer_state, cfg.train,
                         source=str(path / "optimizer.safetensors"))
    if ema is not None:
        if "ema" in snap.extra_tensors:
            ema.load_state_dict(snap.extra_tensors["ema"])
            ema.num_updates = int((snap.trainer_state.get("ema") or {}).get("updates", 0))
        else:
            log.warning("train.ema_decay is on but %s has no EMA weights: the EMA starts from "
                        "the restored weights", path)
    elif "ema" in snap.extra_tensors:
        log.info("train.ema_decay is 0: the EMA weights of %s are not carried on", path)
    return _restore_rest(snap, path, guard)


def _restore_rest(snap: Snapshot, path: Path, guard: SpikeGuard) -> TrainerState:
    """Trainer state, spike guard and this rank's RNG streams."""
    state = TrainerState.from_json(snap.trainer_state, str(path / "trainer_state.json"))
    guard.load_state_dict(snap.trainer_state["spike_guard"])
    restore_rng_state(snap.rng_state)
    log.info("resumed from %s: step %d, cursor %s", path, state.step, state.cursor.to_json())
    return state


def snapshot_contents(*, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                      trainer_state: dict[str, Any], rng_state: dict[str, Any], cfg: Config,
                      ema: WeightsEMA | None, files: dict[str, str]) -> dict[str, Any]:
    """Keyword arguments of :func:`~pipeline_lib.checkpoint.snapshot.write_snapshot`."""
    return {
        "model_state": model.state_dict(),
        "optimizer_state": optimizer.state_dict(),
        "trainer_state": trainer_state,
        "rng_state": rng_state,
        "config_yaml": config_yaml(cfg),
        "extra_tensors": {"ema": ema.state_dict()} if ema is not None else None,
        "extra_files": files,
    }


__all__ = ["TrainerState", "build_model", "capture_rng_state", "moe_biases",
           "resolve_config", "restore_snapshot", "set_determinism", "snapshot_contents"]
