"""A segment's set-up and its counters.

:func:`build_model` seeds and builds the model, :func:`set_determinism` picks kernels,
:func:`resolve_config` fits the config to the pack; :class:`TrainerState` holds the
trainer's counters, data cursor and tracking ids (the ``trainer`` part of a snapshot, the
top level of ``trainer_state.json``; the other parts are in :mod:`.states`).
"""

from __future__ import annotations

import dataclasses
import os
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..data.loader import DataCursor, PackedData
from ..errors import CheckpointError, ConfigError, DataError
from ..memory_check import check_training_memory
from ..model.looped import LoopedLM
from ..spec.config import Config
from ..spec.rules import check_exit_gate_trained
from .spike_guard import json_float

STATE_FORMAT = 1


@dataclass
class TrainerState:
    """Counters and records carried from segment to segment (``trainer_state.json``)."""

    step: int = 0  # optimizer (global) steps done; the next step is step + 1
    tokens_seen: int = 0  # input tokens consumed, skipped steps included
    cursor: DataCursor = field(default_factory=DataCursor)  # next row of the data stream
    optimizer_steps: int = 0  # optimizer.step() calls (unrolled backprop: several per step)
    tracking_run_id: str | None = None  # the MLflow child run all segments continue
    rollbacks: list[dict[str, Any]] = field(default_factory=list)
    val_loss: float | None = None  # at this snapshot's step
    best_val: dict[str, Any] | None = None  # {"step", "val_loss"}: lowest so far
    lr: dict[str, float] = field(default_factory=dict)  # per group, at the last step
    segments: list[dict[str, Any]] = field(default_factory=list)  # one record per segment
    warm_start: dict[str, Any] | None = None  # weights-only start this run began from
    preemptions: list[dict[str, Any]] = field(default_factory=list)  # stops (resume points)
    total_steps: int = 0  # the run's planned steps (a record; the plan decides)
    source: str = "trainer_state.json"  # where a loaded state came from (for errors)

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "step": self.step,
            "total_steps": self.total_steps,
            "tokens_seen": self.tokens_seen,
            "cursor": self.cursor.to_json(),
            "optimizer_steps": self.optimizer_steps,
            "lr": self.lr,
            "tracking_run_id": self.tracking_run_id,
            "rollbacks": self.rollbacks,
            "val_loss": json_float(self.val_loss),
            "best_val": self.best_val,
            "segments": self.segments,
            "warm_start": self.warm_start,
            "preemptions": self.preemptions,
        }

    def load_state_dict(self, doc: dict[str, Any]) -> None:
        loaded = self.from_json(doc, self.source)
        for f in dataclasses.fields(self):
            if f.name not in ("total_steps", "source"):
                setattr(self, f.name, getattr(loaded, f.name))

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
                       best_val=doc.get("best_val"), lr=dict(doc.get("lr") or {}),
                       segments=list(doc.get("segments") or []),
                       warm_start=doc.get("warm_start"),
                       preemptions=list(doc.get("preemptions") or []), source=source)
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


def build_model(cfg: Config, device: torch.device, world_size: int = 1) -> LoopedLM:
    """The model, initialised from ``experiment.seed`` (on the CPU, then moved); a config
    whose training cannot fit in memory is refused first, before anything is allocated
    (:func:`~pipeline_lib.memory_check.check_training_memory`)."""
    check_training_memory(cfg, device, world_size)
    seed = cfg.experiment.seed
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return LoopedLM(cfg.model).to(device)


def resolve_config(cfg: Config, data: PackedData) -> Config:
    """``cfg`` with ``model.vocab_size`` taken from the pack when 0 (a trained BPE's: the
    pack's metadata.json is where it is decided; resolve_run fills the others); the pack's
    sequence length must be ``data.seq_len``, an answer_* objective needs answer spans, and
    an exit gate needs the objective that trains it."""
    if data.seq_len != cfg.data.seq_len:
        raise DataError(f"data directory {data.data_dir} is packed with seq_len {data.seq_len}, "
                        f"config data.seq_len is {cfg.data.seq_len}; pass the data directory "
                        "of this config (results/data/<data_id>) or re-pack")
    if cfg.train.objective.startswith("answer_") and not data.has_answer_spans:
        raise ConfigError(f"train.objective = {cfg.train.objective} scores answer tokens only, "
                          f"but the pack {data.data_dir} has no answer spans; add a reasoning "
                          "source or prompt_field/answer_field to a data source, or use "
                          "train.objective last or deep_supervision")
    check_exit_gate_trained(cfg.train, cfg.model)
    vocab = cfg.model.vocab_size or data.vocab_size
    if vocab < data.vocab_size:
        raise DataError(f"model.vocab_size = {vocab} is smaller than the tokenizer's "
                        f"{data.vocab_size} ids in {data.data_dir}; set model.vocab_size: 0")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, vocab_size=vocab))


__all__ = ["TrainerState", "build_model", "resolve_config", "set_determinism"]
