"""Train one segment: restore the previous snapshot, run steps up to ``until_step``, save.

The loop reads like the job it is (torchtitan's shape)::

    build → restore (snapshot or fresh; rollback on a retry after an abort)
    while step < until_step: train_step → validate when due → log
    validate at the end → greedy samples → write snapshot → commit logs → end

Exactness: the model is initialised from ``experiment.seed``; the data cursor, optimizer
moments, spike-guard baselines, MoE biases, EMA and RNG streams come back from the
snapshot; loop counts and the lr are pure functions of the step. With
``train.deterministic`` (CPU), N steps in one segment and the same steps in several give
bit-identical weights. Validation and samples draw no random numbers and change no state.

With ``world_size`` > 1 (processes started by torchrun, see :mod:`.launch`) the model is
sharded with FSDP2 (:mod:`.distributed`), each rank reads its block of every global step's
rows, the step statistics are reduced before the spike guard decides, all ranks validate
and write their shards of a sharded snapshot, and only rank 0 logs, tracks and writes the
run-level files. The rows of every step are the same at any world size.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..checkpoint import state_io
from ..checkpoint.best import update_best_snapshot
from ..checkpoint.restore import Snapshot, load_weights_only, restore_snapshot
from ..checkpoint.rng import RNGStreams
from ..data.loader import DataCursor, PackedData
from ..errors import ConfigError, TrainingError
from ..model.loop_sampling import LoopSampler
from ..model.looped import LoopedLM
from ..precision import Precision
from ..spec.config import Config
from ..spec.config_write import config_yaml
from ..spec.layout import snapshots_dir_of
from ..spec.names import TOKENIZER_FILE
from . import rollback
from .batch_plan import BatchPlan, make_batch_plan
from .diagnostics import due
from .distill import SourceBuilder, load_teacher
from .distributed import RankGroup, process_device, reshard, shard_model, shards_model
from .ema import WeightsEMA
from .evaluation import generate_samples, samples_jsonl, validation_losses
from .freeze import freeze_parts
from .hooks import StepHooks, installed_step_hooks
from .metrics import TrainLog
from .optim import build_optimizer
from .preempt import StopRequest
from .schedule import LRSchedule
from .segment import TrainerState, build_model, resolve_config, set_determinism
from .segment_start import SegmentStart
from .spike_guard import SpikeGuard
from .states import ConfigPart, EMAPart, ModelPart, MoEBiases, OptimizerPart
from .step import StepResult, StepRunner

log = logging.getLogger(__name__)


@dataclass
class Trainer:
    """Everything one segment trains with; built by :meth:`build`."""

    cfg: Config
    data: PackedData
    device: torch.device
    model: LoopedLM
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    guard: SpikeGuard
    ema: WeightsEMA | None
    sampler: LoopSampler
    runner: StepRunner
    plan: BatchPlan
    total_steps: int
    hooks: StepHooks  # no-ops unless installed from outside (fault tests)
    state: TrainerState
    world_size: int = 1
    rank: int = 0
    input_snapshot: Path | None = None  # the snapshot this segment resumed (its last good one)
    signature: str = ""  # the job's train signature (its rollback record carries it)
    resume_step: int = 0
    rollback: dict[str, Any] | None = None  # a rollback record waiting for its step
    rollback_applied: bool = False
    step_time_s: float = 0.0  # inside train steps (data, forward, backward, optimizer)
    loop_time_s: float = 0.0  # the whole step loop, logging included, validation excluded
    loop_cpu_s: float = 0.0  # the same, in process CPU time (robust on a shared machine)
    eval_time_s: float = 0.0  # validation inside the loop
    eval_cpu_s: float = 0.0
    rng: RNGStreams = field(default_factory=RNGStreams)  # captured right after the last step
    cursors: dict[int, DataCursor] = field(default_factory=dict)  # this segment's, by step
    group: RankGroup | None = None  # the collectives, when sharded (see shards_model)
    carried_files: dict[str, bytes] = field(default_factory=dict)  # of a resume point

    @functools.cached_property
    def config_text(self) -> str:
        """The resolved config as YAML (``config.yaml`` of every snapshot it writes)."""
        return config_yaml(self.cfg)
    precision: Precision | None = None  # experiment.precision on this device (None: fp32)

    @classmethod
    def build(cls, cfg: Config, data_dir: Path, *, world_size: int = 1, rank: int = 0,
              build_source: SourceBuilder | None = None) -> Trainer:
        device = process_device(cfg.experiment.device, world_size, rank)
        precision = Precision.resolve(cfg.experiment.precision, device)  # fails before work
        log.info("computing on %s in %s (experiment.precision = %s)", device, precision.name,
                 cfg.experiment.precision)
        set_determinism(cfg.train.deterministic, device, compiled=cfg.train.compile)
        data = PackedData(data_dir)
        cfg = resolve_config(cfg, data)
        plan = make_batch_plan(cfg.train, world_size)
        total = cfg.train.total_steps  # decided once, by resolve_run (the token budget too)
        if total < 1:
            raise ConfigError("train.total_steps = 0 reached the trainer: a token budget is "
                              "turned into steps by pipeline_lib.workflow.resolve.resolve_run; "
                              "train the config of the run's RunSpec")
        model = build_model(cfg, device, world_size)  # same seeded init on every rank
        if cfg.train.freeze:  # before sharding, the optimizer and the EMA see the flags
            frozen = freeze_parts(model, cfg.train.freeze)
            log.info("train.freeze %s: %d parameters fixed", cfg.train.freeze, frozen)
        group = None
        if shards_model(world_size):
            group = RankGroup.current(device, shard_model(model, precision))
        optimizer = build_optimizer(model, cfg.train)
        guard = SpikeGuard(cfg.train.spike)
        ema = WeightsEMA(model, cfg.train.ema_decay) if cfg.train.ema_decay > 0 else None
        hooks = installed_step_hooks()
        forward = torch.compile(model) if cfg.train.compile else None
        runner = StepRunner(model, optimizer, cfg.train, guard, ema=ema, hooks=hooks,
                            device=device, forward=forward, group=group,
                            amp=precision if group is None else None,  # FSDP: its policy
                            teacher=load_teacher(cfg, data, device, build_source),
                            seed=cfg.experiment.seed)
        sampler = LoopSampler(cfg.train.loop_sampling, cfg.model.loops, cfg.experiment.seed)
        return cls(cfg=cfg, data=data, device=device, model=model, optimizer=optimizer,
                   schedule=LRSchedule.from_config(cfg.train, total), guard=guard, ema=ema,
                   sampler=sampler, runner=runner, plan=plan, total_steps=total, hooks=hooks,
                   state=TrainerState(total_steps=total), world_size=world_size, rank=rank,
                   group=group, precision=precision)

    def parts(self, source: Path | None = None) -> dict[str, Any]:
        """Every stateful part of the segment, by the name the checkpoint layer stores it
        under (see :mod:`pipeline_lib.checkpoint.state_io`); ``source``: the snapshot being
        loaded, for error messages."""
        sharded = self.group is not None
        parts: dict[str, Any] = {
            "config": ConfigPart(self.cfg, source, text=self.config_text),
            "model": ModelPart(self.model, sharded=sharded, source=source),
            "optimizer": OptimizerPart(self.model, self.optimizer, self.cfg, sharded=sharded,
                                       source=source),
            "rng": self.rng, "trainer": self.state, "spike_guard": self.guard,
            "loop_sampling": self.sampler, "moe_biases": MoEBiases(self.model)}
        if self.ema is not None:
            parts["ema"] = EMAPart(self.ema)
        return parts

    def autocast(self) -> AbstractContextManager:
        """The configured precision around a forward pass on one device (with several ranks
        FSDP's mixed-precision policy applies it instead)."""
        if self.precision is None or self.group is not None:
            return nullcontext()
        return self.precision.autocast()

    @property
    def ranks(self) -> state_io.Ranks | None:
        return (None if self.group is None
                else state_io.Ranks(self.rank, self.world_size, self.device))

    # ------------------------------------------------------------------ restore

    def warm_start(self, snapshot: Path) -> None:
        """Deliberate weights-only start: copy ``snapshot``'s weights, keep everything else
        fresh (optimizer, spike guard, RNG, data cursor, step 0)."""
        info = load_weights_only(snapshot, self.model)  # cuts full weights into shards
        if self.ema is not None:
            self.ema = WeightsEMA(self.model, self.cfg.train.ema_decay)
            self.runner.ema = self.ema
        self.state.warm_start = info
        log.warning("warm start from %s: weights only; optimizer, guard, RNG and data cursor "
                    "start fresh at step 0", snapshot)

    def restore(self, start: SegmentStart) -> None:
        """Begin as ``start`` says (:func:`~.segment_start.segment_start` decided it): load
        its input snapshot or this job's resume point (neither: fresh), copy a warm start's
        weights, hold a rollback record until its step."""
        self.input_snapshot, self.signature = start.input, start.signature
        self.guard.last_good_snapshot = None if start.input is None else str(start.input)
        if start.load is not None:
            snap = self._load(start.load)
            self.carried_files = snap.extra_files if start.stopped else {}
        self.resume_step = (int(start.stopped["segment_start"]) if start.stopped
                            else self.state.step)
        if start.rollback is not None:
            record = self.rollback = start.rollback
            log.warning("attempt %d: rolling back to step %d; at step %d the data cursor will "
                        "jump from %s to %s (abort at step %d)", start.attempt, self.state.step,
                        record["window_steps"][0], record["window_cursor"][0],
                        record["resume_cursor"], record["abort_step"])
        if start.warm_start is not None:
            self.warm_start(start.warm_start)

    def _load(self, snapshot: Path) -> Snapshot:
        """Every part from ``snapshot`` (collective with several ranks); an EMA the snapshot
        lacks starts from the restored weights."""
        parts = self.parts(source=snapshot)
        self.state.source = str(snapshot / "trainer_state.json")
        snap = restore_snapshot(snapshot, parts, ranks=self.ranks, map_location=self.device)
        if self.ema is not None and not parts["ema"].loaded:
            self.ema = self.runner.ema = WeightsEMA(self.model, self.cfg.train.ema_decay)
        log.info("resumed from %s: step %d, cursor %s", snapshot, self.state.step,
                 self.state.cursor.to_json())
        return snap

    def _maybe_jump(self, step: int) -> None:
        """Apply a pending rollback at its first bad step: skip the data window that caused
        the abort plus ``rollback_skip_steps`` steps; the step counter goes on."""
        if self.rollback is None or step != self.rollback["window_steps"][0]:
            return
        record, self.rollback = self.rollback, None
        rollback.jump(record, self.state, self.guard, step)
        self.rollback_applied = True

    # ------------------------------------------------------------------ the loop

    def train(self, until_step: int, train_log: TrainLog, *, run_dir: Path, attempt: int,
              stop: StopRequest | None = None) -> str | None:
        """Steps ``state.step + 1 … until_step``, each logged as one line; returns the
        reason when ``stop`` asked to end early (after a whole step), else None."""
        reason = None
        self.step_time_s = self.eval_time_s = self.eval_cpu_s = 0.0
        loop_started, cpu_started = time.perf_counter(), time.process_time()
        bar = tqdm(total=until_step - self.state.step, desc=f"train →{until_step}", unit="step",
                   mininterval=2.0, disable=self.rank != 0)
        try:
            while self.state.step < until_step:
                step = self.state.step + 1
                self.hooks.before_step(step)
                record = self.train_step(step, run_dir=run_dir, attempt=attempt)
                if step == until_step or due(step, self.cfg.train.eval_interval):
                    record.update(self._timed_validate())
                train_log.step(record)
                bar.update(1)
                bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                                refresh=False)
                reason = stop.requested(self.group) if stop is not None else None
                if reason is not None and step < until_step:
                    break
        finally:
            bar.close()
            self.loop_time_s = time.perf_counter() - loop_started - self.eval_time_s
            self.loop_cpu_s = time.process_time() - cpu_started - self.eval_cpu_s
        self.rng.capture()  # before anything else can touch a stream
        return reason if self.state.step < until_step else None

    def train_step(self, step: int, *, run_dir: Path, attempt: int) -> dict[str, Any]:
        """Global step ``step``: its data, loop count and lr, the step itself; its record."""
        started = time.perf_counter()
        self._maybe_jump(step)
        plan, cursor = self.plan, self.state.cursor
        self.cursors[step] = cursor
        micro, next_cursor = self.data.batches_for_step(
            cursor, plan.global_batch_rows, plan.micro_batch_rows, self.world_size, self.rank)
        loops = self.sampler.loops(step)
        self.schedule.apply(self.optimizer.param_groups, step - 1)
        try:
            result = self.runner.run(
                step, micro, loops, flat_row=cursor.epoch * self.data.rows_per_epoch + cursor.row,
                diagnose=due(step, self.cfg.train.diagnostics_interval))
        except TrainingError:  # the spike guard gave up: leave the record a retry rolls back by
            if self.rank == 0:
                self._write_rollback(step, next_cursor, run_dir, attempt)
            raise
        elapsed = time.perf_counter() - started
        self.step_time_s += elapsed
        self._advance(step, next_cursor, result)
        return self._record(step, cursor, result, elapsed)

    def _timed_validate(self) -> dict[str, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        losses = self.validate()
        self.eval_time_s += time.perf_counter() - wall
        self.eval_cpu_s += time.process_time() - cpu
        return losses

    def _advance(self, step: int, next_cursor: DataCursor, result: StepResult) -> None:
        s = self.state
        s.step, s.cursor = step, next_cursor
        s.tokens_seen += self.plan.tokens_per_step(self.data.seq_len)
        s.optimizer_steps += result.optimizer_steps
        self.sampler.last_loops = result.loops
        s.lr = {g["name"]: g["lr"] for g in self.optimizer.param_groups}

    def _record(self, step: int, cursor: DataCursor, result: StepResult,
                elapsed: float) -> dict[str, Any]:
        tokens = self.plan.tokens_per_step(self.data.seq_len)
        record: dict[str, Any] = {
            "step": step, "loss": result.loss, "aux_loss": result.aux_loss,
            "lr": self.optimizer.param_groups[0]["lr"], "grad_norm": result.grad_norm,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0, "step_time_s": elapsed,
            "loops": result.loops, "skipped": result.skipped, "cursor": cursor.to_json(),
            "tokens_seen": self.state.tokens_seen,
        }
        if result.reason:
            record["skip_reason"] = result.reason
        if result.grad_loops is not None:  # progressive backprop: the loops with gradients
            record["grad_loops"] = result.grad_loops
        if len(result.unroll_losses) > 1 or self.cfg.train.bptt.mode == "unrolled":
            record["unroll_losses"] = result.unroll_losses
        # deep supervision: the loss read out after each loop t (train/loss_h{t})
        record.update({f"loss_h{t}": v for t, v in sorted(result.readout_losses.items())})
        if result.distill_kl is not None:  # train.distill: KL to the teacher (train/distill_kl)
            record["distill_kl"] = result.distill_kl
        record.update(result.moe)
        record.update(result.diagnostics)
        return record

    def _write_rollback(self, step: int, next_cursor: DataCursor, run_dir: Path,
                        attempt: int) -> None:
        cursors = self.cursors
        first_bad = max(step - self.guard.consecutive + 1, min(cursors))
        skip = self.cfg.train.rollback_skip_steps
        record = rollback.make_record(
            input_snapshot=self.input_snapshot, input_step=self.resume_step, abort_step=step,
            first_bad_step=first_bad, window_start=cursors[first_bad], window_end=next_cursor,
            resume_cursor=self.data.advance(next_cursor, skip, self.plan.global_batch_rows),
            skip_steps=skip, attempt=attempt, signature=self.signature)
        path = rollback.write_record(run_dir, record)
        log.error("spike guard abort at step %d: rollback record %s (a retry resumes from %s "
                  "at cursor %s)", step, path, self.input_snapshot or "scratch",
                  record["resume_cursor"])

    # ------------------------------------------------------------------ end of segment

    @property
    def val_h_eff(self) -> list[int]:
        """The loop counts validation reads out besides ``model.loops``: ``train.val_h_eff``,
        or ``eval.h_eff`` when that is empty."""
        return list(self.cfg.train.val_h_eff or self.cfg.eval.h_eff)

    def validate(self) -> dict[str, float]:
        """``{"val_loss": loss after model.loops loops, "val/loss_h{H}": loss after H loops
        for every H of :attr:`val_h_eff`}``, all from one pass per batch. ``val_loss`` is the
        one the state, best-snapshot selection and the generated results read."""
        t, loops = self.cfg.train, self.cfg.model.loops
        with self.autocast():
            losses = validation_losses(self.model, self.data, t.eval_rows, t.micro_batch_rows,
                                       readouts=[loops, *self.val_h_eff], device=self.device,
                                       answer_only=t.objective.startswith("answer_"))
        if self.group is not None:  # every rank evaluated the same rows with the same weights
            reshard(self.model)
        loss = self.state.val_loss = losses[loops]
        best = self.state.best_val
        if math.isfinite(loss) and (best is None or loss < float(best["val_loss"])):
            self.state.best_val = {"step": self.state.step, "val_loss": loss}
        by_h = {f"val/loss_h{h}": losses[h] for h in sorted(set(self.val_h_eff))}
        return {"val_loss": loss, **by_h}

    def save_resume_point(self, path: Path, train_log: TrainLog, record: dict[str, Any]) -> None:
        """A complete snapshot at the current step that only a retry of this job reads
        (``record``: why and where it stopped, appended to ``state.preemptions``)."""
        self.state.preemptions.append(record)
        state_io.save(path, self.parts(), files=train_log.snapshot_files(), ranks=self.ranks)

    def save(self, out: Path, train_log: TrainLog, segment: dict[str, Any]) -> Path:
        """Samples, then the snapshot (atomic), then the best copy when asked."""
        t = self.cfg.train
        with self.autocast():
            samples = generate_samples(self.model, self.data.data_dir, t.sample_prompts,
                                       t.sample_tokens, step=self.state.step,
                                       loops=self.cfg.model.loops, context_len=self.data.seq_len,
                                       device=self.device)
        if self.group is not None:
            reshard(self.model)
        self.state.segments.append(segment)
        files = {**train_log.snapshot_files(), "samples.jsonl": samples_jsonl(samples),
                 # a snapshot is self-contained: evaluation needs no data pack to tokenize
                 TOKENIZER_FILE: (self.data.data_dir / TOKENIZER_FILE).read_bytes()}
        # collective with several ranks: each writes its shards and RNG, rank 0 the rest
        state_io.save(out, self.parts(), files=files, ranks=self.ranks)
        if self.cfg.snapshots.keep_best and self.state.val_loss is not None and self.rank == 0:
            # one snapshots/best for kept and temporary (snapshots/transient/) snapshots alike;
            # the first segment since scratch replaces a best left by an earlier training
            update_best_snapshot(snapshots_dir_of(out), out, self.state.val_loss,
                                 new_history=len(self.state.segments) == 1)
        if self.group is not None:
            self.group.barrier()  # nobody moves on before the best copy is settled
        return out
