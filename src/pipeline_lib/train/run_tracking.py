"""How a segment reports to MLflow: the narrow interface the trainer calls, implemented by
the ``train`` stage (:class:`pipeline_lib.workflow.stages.train.TrainTracking`), which owns
the tracking. Without one (``tracking=None``) a segment logs nothing to MLflow, whatever
``tracking.enabled`` says: the train stage is the door that tracks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the trainer imports this module
    from .trainer import Trainer


class SegmentTracking(Protocol):
    """Called on rank 0 only, in this order: :meth:`start` once the trainer is restored and
    before the first step; :meth:`saved` once the snapshot is durable and the segment's
    metrics are committed. The stage run that :meth:`start` returns receives every step's
    metrics (:class:`~pipeline_lib.train.metrics.TrainLog`) and is ended by the job
    (FINISHED, FAILED or KILLED)."""

    def start(self, trainer: Trainer, run_dir: Path, data_dir: Path) -> Any:
        """The segment's child run (a :class:`~pipeline_lib.tracking.StageRun`); records its
        id in ``trainer.state`` (it travels in the snapshot)."""

    def saved(self, stage: Any, trainer: Trainer, out: Path, run_dir: Path) -> None:
        """After the save: the segment's artifacts; after the run's last segment, its
        headline results on the parent run."""
