"""A segment's MLflow ``train`` child run: started (or continued) with the segment, and the
artifacts it receives once the segment's logs are committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import Config, flatten, public_dict
from ..run_layout import RunLayout
from .segment import TrainerState


def start_tracking(cfg: Config, state: TrainerState, run_dir: Path, data_id: str | None) -> Any:
    """The MLflow ``train`` child run (continued across segments); params on its first use.
    Records the run id in ``state`` (it travels in the snapshot)."""
    from ..tracking import start_stage

    first = state.tracking_run_id is None
    stage = start_stage(cfg, run_dir, "train", run_id=state.tracking_run_id,
                        params=flatten(public_dict(cfg)) if first else None, data_id=data_id)
    state.tracking_run_id = stage.run_id
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
