"""One training segment as a stage: rule ``train_segment`` and the ``train`` command call
:func:`train_stage`, which trains in this process, launches a torchrun job of
``train.nproc`` × ``train.nnodes`` processes, or (in one of that job's workers) trains its rank.

The segment is the MLflow child run ``train``, continued across segments (its id travels in
the snapshot) so that the curves are continuous: :class:`TrainTracking` opens it before the
first step, the step loop logs every step, and the metrics are committed only once the
snapshot is durable (exactly once, see :mod:`pipeline_lib.tracking.stage`). After the run's
last segment the parent run receives the ``train`` headline group (size and cost).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...model.kernels import kernel_tags
from ...retrofit.hf_import import source_teacher  # train.distill.teacher = source
from ...spec.config import Config
from ...spec.config_model import ModelConfig
from ...spec.config_write import flatten, public_dict
from ...spec.layout import RunLayout
from ...spec.retention import record_written
from ...spec.size import flops_per_token, param_count
from ...tracking import StageRun, start_stage
from ...train.distributed import launched_by_torchrun
from ...train.launch import run_training_job, train_in_process
from ...train.trainer import Trainer


class TrainTracking:
    """The ``train`` stage's tracking of a segment (the trainer calls it on rank 0, see
    :class:`pipeline_lib.train.run_tracking.SegmentTracking`)."""

    def start(self, trainer: Trainer, run_dir: Path, data_dir: Path) -> StageRun:
        """The ``train`` child run, continued from the restored state's run id; params on its
        first use; the pack (its ``metadata.json``) as its dataset input (idempotent)."""
        cfg, state, meta = trainer.cfg, trainer.state, trainer.data.metadata
        first = state.tracking_run_id is None
        stage = start_stage(cfg, run_dir, "train", run_id=state.tracking_run_id,
                            params=flatten(public_dict(cfg)) if first else None,
                            data_id=meta.get("data_id"))
        state.tracking_run_id = stage.run_id
        stage.log_dataset(meta, data_dir)
        return stage

    def saved(self, stage: StageRun, trainer: Trainer, out: Path, run_dir: Path) -> None:
        """Resolved config, this segment's samples, the TensorBoard events (after the commit);
        the kernels the segment ran as tags (a fallback from FlexAttention or grouped GEMM);
        after the run's last segment its ``train`` headline group on the parent run."""
        stage.set_tags(kernel_tags())
        stage.log_artifact(out / "config.yaml", "train")
        stage.log_artifact(out / "samples.jsonl", f"train/samples/{out.name}")
        tensorboard = RunLayout.at(run_dir).tensorboard
        if tensorboard.is_dir():
            stage.log_artifact(tensorboard, "tensorboard")
        state = trainer.state
        if state.total_steps and state.step >= state.total_steps:
            stage.log_headline("train", train_values(trainer.cfg.model, trainer.data.seq_len,
                                                     state.tokens_seen, state.segments),
                               {"step": state.step})


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


def train_stage(cfg: Config, data_dir: Path, resume_from: Path | None, until_step: int,
                out: Path, run_dir: Path | None = None, attempt: int = 1, *,
                warm_start: Path | None = None,
                signature: str | None = None) -> tuple[Path, int]:
    """Train from ``resume_from`` (None: from scratch, or from ``warm_start``'s weights) to
    ``until_step`` and write the snapshot ``out``, tracked as the ``train`` child run (none
    with ``tracking.enabled: false``). ``attempt`` > 1 is a retry (a rollback record or a
    resume point of an earlier attempt is applied). ``signature`` (the workflow's train
    signature): record in the run's retention ledger whether ``out`` is a kept or a temporary
    segment snapshot (:func:`~pipeline_lib.spec.retention.record_written`). Returns (out,
    this process's rank)."""
    job = (cfg, data_dir, resume_from, until_step, out, run_dir, attempt)
    if launched_by_torchrun():  # one worker of a torchrun job: join it, train this rank
        return train_in_process(*job, warm_start=warm_start, tracking=TrainTracking(),
                                build_source=source_teacher)
    written = run_training_job(*job, warm_start=warm_start, tracking=TrainTracking(),
                               build_source=source_teacher)
    if run_dir is not None and signature:
        _record_placement(RunLayout.at(run_dir), until_step, Path(out), signature)
    return written, 0


def _record_placement(layout: RunLayout, step: int, out: Path, signature: str) -> None:
    """Note where the segment snapshot ``out`` went, kept or temporary (nothing for a
    snapshot outside the run's layout)."""
    for kept in (True, False):
        if out.absolute() == layout.snapshot(step, kept=kept).absolute():
            record_written(layout, step, kept=kept, signature=signature)
