"""One segment job: restore, train to ``until_step``, save; or stop with a resume point.

:func:`train_segment` is what the ``train`` command (and, through :mod:`.launch`, the
``train_segment`` rule) runs on every rank. A SIGTERM/SIGUSR1 or the job's time limit
(:mod:`.preempt`) ends the step loop after a whole step: the job then writes a resume point
(``{run}/train/resume/step_{until}``), commits the metrics of the steps done and raises
:class:`~pipeline_lib.errors.Preempted`; a retry of the job continues from there. A finished
segment's snapshot takes the resume point's place as hard links (:mod:`.finished`), so a
job of the same segment whose output Snakemake deleted adopts it instead of training again.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from ..checkpoint.compat import check_snapshot_fits_pack
from ..checkpoint.contents import check_snapshot_output
from ..errors import ConfigError, Preempted, TrainingError
from ..output_paths import check_output_location
from ..spec.config import Config
from ..spec.layout import run_dir_of
from ..spec.names import TOKENIZER_FILE
from ..tracking.health import check_store
from . import rollback
from .distill import SourceBuilder
from .finished import keep_finished, stage_finished
from .metrics import TrainLog
from .preempt import StopRequest
from .run_logs import check_run_logs, claim_run_logs
from .run_tracking import SegmentTracking
from .segment_start import (
    SegmentStart,
    check_start_inputs,
    input_digest,
    segment_signature,
    segment_start,
)
from .trainer import Trainer

log = logging.getLogger(__name__)


def _check_steps(until_step: int, trainer: Trainer, resume_from: Path | None) -> None:
    start = trainer.state.step
    if until_step > trainer.total_steps:
        raise ConfigError(f"--until-step {until_step} exceeds the run's {trainer.total_steps} "
                          "steps (train.total_steps, or the token budget); lower it or raise "
                          "train.total_steps")
    if until_step <= start:
        raise ConfigError(f"--until-step {until_step} is not past the resumed step {start} "
                          f"({resume_from}); pass a later step or an earlier snapshot")


def check_segment_outputs(out: Path, run_dir: Path | None) -> None:
    """Before anything is built: ``out`` may receive the snapshot (new, or a snapshot to
    replace) and the run directory of the logs can be written (one-line errors)."""
    check_snapshot_output(Path(out))
    check_output_location(Path(run_dir) if run_dir is not None else run_dir_of(Path(out)),
                          "run directory (training logs)")


def _check_tokenizer(trainer: Trainer, start: SegmentStart) -> None:
    """The snapshot resumed or warm-started from was trained on the pack's tokenizer."""
    if start.input is not None:
        check_snapshot_fits_pack(start.input, trainer.data, use="resume",
                                 fix="pass --data the pack this run was trained on")
    elif start.warm_start is not None:
        check_snapshot_fits_pack(
            start.warm_start, trainer.data, use="warm start",
            fix=f"pack the corpus with the snapshot's tokenizer (data.tokenizer: {{type: file, "
                f"path: {start.warm_start / TOKENIZER_FILE}}}) and pass that pack as --data")


def train_segment(cfg: Config, data_dir: Path, resume_from: Path | None, until_step: int,
                  out: Path, run_dir: Path | None = None, attempt: int = 1, *,
                  world_size: int = 1, rank: int = 0, warm_start: Path | None = None,
                  tracking: SegmentTracking | None = None,
                  build_source: SourceBuilder | None = None) -> Path:
    """Train from ``resume_from`` (None: from scratch) to ``until_step``; snapshot to ``out``.

    ``cfg`` is a run's completed config (a :class:`~pipeline_lib.spec.run_spec.RunSpec`'s:
    ``train.total_steps`` decided). Run-level logs go to ``run_dir`` (default: ``out``'s run
    directory, see :func:`~pipeline_lib.spec.layout.run_dir_of`). How the segment begins is
    decided once from the job's inputs (:func:`~.segment_start.segment_start`): ``attempt``
    > 1 marks a retry (a rollback record left by an aborted attempt from the same input is
    applied), a resume point left by a stopped attempt is continued from, ``warm_start``
    (only without ``resume_from``) copies another snapshot's weights and nothing else, for a
    deliberate restart under a changed config. ``tracking`` (the ``train`` stage's; None:
    nothing is logged to MLflow) reports the segment on rank 0. ``build_source``: how
    ``train.distill.teacher = source`` builds the pretrained teacher (:mod:`.distill`).
    Returns ``out``.
    """
    wall_start = time.perf_counter()
    out, data_dir = Path(out), Path(data_dir)
    run_dir = Path(run_dir) if run_dir is not None else run_dir_of(out)
    resume_from = None if resume_from is None else Path(resume_from)
    warm_start = None if warm_start is None else Path(warm_start)
    check_start_inputs(resume_from, warm_start)
    check_segment_outputs(out, run_dir)
    if rank == 0:
        check_run_logs(run_dir, out, resume_from)
    if rank == 0 and tracking is not None and cfg.tracking.enabled:  # a lost or corrupt store
        check_store(cfg, run_dir)
    signature = segment_signature(cfg, data_dir)
    start = segment_start(run_dir, resume_from, until_step, attempt=attempt,
                          warm_start=warm_start, signature=signature)
    trainer = Trainer.build(cfg, data_dir, world_size=world_size, rank=rank,
                            build_source=build_source)
    trainer.restore(start)
    _check_tokenizer(trainer, start)
    _check_steps(until_step, trainer, resume_from)
    job_start = trainer.resume_step
    stage = tracking.start(trainer, run_dir, data_dir) if rank == 0 and tracking else None
    try:
        _run(trainer, until_step, out, run_dir, attempt, stage, tracking, point=start.point,
             job_start=job_start, wall_start=wall_start, signature=signature)
    except BaseException as exc:
        if stage is not None:
            stage.end("KILLED" if isinstance(exc, (KeyboardInterrupt, Preempted)) else "FAILED")
        raise
    if stage is not None:
        stage.end("FINISHED")
    if rank == 0:
        rollback.clear_record(run_dir, resume_from, job_start)
    log.info("segment %d→%d done in %.1f s (%.1f s in steps): %s", job_start, until_step,
             time.perf_counter() - wall_start, trainer.step_time_s, out)
    return out


def _run(trainer: Trainer, until_step: int, out: Path, run_dir: Path, attempt: int,
         stage: Any, tracking: SegmentTracking | None, *, point: Path, job_start: int,
         wall_start: float, signature: str) -> None:
    """The step loop and the save (or the resume point when asked to stop); the saved
    snapshot is kept in the resume point's place too (:mod:`.finished`)."""
    if trainer.rank == 0:
        claim_run_logs(run_dir, out)
    train_log = TrainLog(run_dir, trainer.state.step, stage=stage, enabled=trainer.rank == 0)
    train_log.carry(trainer.carried_files)
    trainer.guard.event_sink = train_log.event
    try:
        with StopRequest(trainer.cfg.train) as stop:
            try:
                reason = trainer.train(until_step, train_log, run_dir=run_dir,
                                       attempt=attempt, stop=stop)
            except TrainingError:  # a rollback retries from the job's input, not from here
                shutil.rmtree(point, ignore_errors=True)
                raise
        if reason is not None:
            _stop(trainer, train_log, point, reason, until_step=until_step,
                  job_start=job_start, attempt=attempt, signature=signature)
        segment = {"start_step": job_start, "end_step": until_step, "attempt": attempt,
                   **_identity(trainer, signature),
                   "rollback": trainer.rollback_applied,
                   "step_time_s": round(trainer.step_time_s, 4),
                   "loop_time_s": round(trainer.loop_time_s, 4),
                   "loop_cpu_s": round(trainer.loop_cpu_s, 4),
                   "eval_time_s": round(trainer.eval_time_s, 4),
                   "wall_before_save_s": round(time.perf_counter() - wall_start, 4)}
        trainer.save(out, train_log, segment)
        staged = stage_finished(out, point) if trainer.rank == 0 else None
        train_log.commit(until_step)
        if trainer.rank == 0:
            keep_finished(staged, point)
        if stage is not None and tracking is not None:
            tracking.saved(stage, trainer, out, run_dir)
    finally:
        train_log.close()


def _identity(trainer: Trainer, signature: str) -> dict[str, Any]:
    """What a later job of this segment compares (:func:`.segment_start.same_segment`)."""
    source = trainer.input_snapshot
    return {"input": None if source is None else str(source),
            "input_manifest": input_digest(source), "signature": signature}


def _stop(trainer: Trainer, train_log: TrainLog, point: Path, reason: str, *,
          until_step: int, job_start: int, attempt: int, signature: str) -> None:
    """Write the resume point, commit the steps done, raise :class:`Preempted`."""
    step = trainer.state.step
    trainer.save_resume_point(point, train_log, {
        "step": step, "reason": reason, "attempt": attempt, "until_step": until_step,
        "segment_start": job_start, **_identity(trainer, signature)})
    train_log.commit(step)
    raise Preempted(f"segment {job_start}→{until_step} stopped by {reason} after step {step}: "
                    f"resume point {point} written; rerun the job (Snakemake retries it) to "
                    "continue from there")


__all__ = ["check_segment_outputs", "train_segment"]
