"""A segment's MLflow ``train`` child run: started (or continued) with the segment, the data
pack as its dataset input, the artifacts it receives once the segment's logs are committed,
and, after the last segment, the run's size and cost on the parent run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..spec.config import Config, ModelConfig, flatten, public_dict
from ..spec.layout import RunLayout
from ..spec.size import flops_per_token, param_count
from .segment import TrainerState


def start_tracking(cfg: Config, state: TrainerState, run_dir: Path, data_id: str | None,
                   data_meta: Mapping[str, Any] | None = None,
                   data_dir: Path | None = None) -> Any:
    """The MLflow ``train`` child run (continued across segments); params on its first use.
    Records the run id in ``state`` (it travels in the snapshot). The pack (``data_meta``,
    its ``metadata.json``) is attached as the run's dataset input (idempotent)."""
    from ..tracking import start_stage

    first = state.tracking_run_id is None
    stage = start_stage(cfg, run_dir, "train", run_id=state.tracking_run_id,
                        params=flatten(public_dict(cfg)) if first else None, data_id=data_id)
    state.tracking_run_id = stage.run_id
    if data_meta is not None and data_dir is not None:
        stage.log_dataset(data_meta, data_dir)
    return stage


def log_artifacts(stage: Any, out: Path, run_dir: Path) -> None:
    """Resolved config, this segment's samples, the TensorBoard events (after the commit);
    the kernels the segment ran as tags (a fallback from FlexAttention or grouped GEMM)."""
    from ..model.kernels import kernel_tags

    stage.set_tags(kernel_tags())
    stage.log_artifact(out / "config.yaml", "train")
    stage.log_artifact(out / "samples.jsonl", f"train/samples/{out.name}")
    tensorboard = RunLayout.at(run_dir).tensorboard
    if tensorboard.is_dir():
        stage.log_artifacts(tensorboard, "tensorboard")


def train_values(model: ModelConfig, seq_len: int, tokens_seen: int,
                 segments: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """The parent run's ``train`` headline group (step 0): parameters, forward FLOPs per token
    at the training loop count (:mod:`pipeline_lib.spec.size`), tokens seen, and the
    training wall time (each segment's job up to its snapshot save, summed)."""
    wall = sum(float(s.get("wall_before_save_s", 0.0)) for s in segments)
    return {"model/params": {0: float(param_count(model))},
            "model/flops_per_token": {0: float(flops_per_token(model, seq_len))},
            "train/tokens_seen": {0: float(tokens_seen)},
            "train/wall_time_s": {0: wall}}


def log_final(stage: Any, cfg: Config, state: TrainerState, seq_len: int) -> None:
    """After the run's last segment is saved: its ``train`` headline group on the parent."""
    if state.total_steps and state.step >= state.total_steps:
        stage.log_headline("train", train_values(cfg.model, seq_len, state.tokens_seen,
                                                 state.segments), {"step": state.step})
