"""One global training step: forward/backward over the micro-batches, guard, optimizer step.

Loss of a micro-batch: the objective over the loop readouts (``last``: the loss after the
last loop; ``deep_supervision``: the mean of the losses after loops 1..n, all from one
pass; ``expected_exit``: the same readouts weighted by the exit gate's distribution, minus
β times its entropy, see :mod:`pipeline_lib.model.exit_gate`), answer tokens weighted by ``train.answer_weight``, plus the model's MoE aux loss.
``answer_last`` / ``answer_deep_supervision`` read out the same way but score the answer
tokens only (the mean loss over ``answer_mask``; ``answer_weight`` is then unused).
Gradients of the micro-batches are accumulated with weight 1/accum each. Under deep
supervision the losses the objective averaged are kept per loop too (``readout_losses``,
detached values of the same pass, fetched with the step's loss in one host sync).

Backprop through loops (``train.bptt``):

- ``full``: one pass, gradients through every loop;
- ``truncated``: the first n − k loops run without autograd (``no_grad_loops``);
- ``progressive``: the same with k drawn per step from 1..min(k, n), seeded by (seed, step)
  (:func:`~pipeline_lib.model.loop_sampling.gradient_loops`);
- ``unrolled`` (K = k loops per unroll): for each unroll, for each micro-batch, run its
  K loops from that micro-batch's detached state and read out (``last``: at the unroll's
  end; ``deep_supervision``: after each of its loops), backward; then clip, let the spike
  guard judge the unroll, step the optimizer, update the MoE
  biases and the EMA, and detach. A spike in one unroll drops the remaining unrolls of
  that global step (the prototype's rule); unrolls already applied stay applied.

``train.activation_checkpointing`` (set on the model here) recomputes each loop's or each
block's activations in backward (:mod:`pipeline_lib.model.recompute`): same gradients.

Every other step is skipped the same way: the guard sees the (mean) loss and the
pre-clipping gradient norm, under a baseline key per loop range (:func:`guard_key`: one
per sampled loop count, and per unroll); on a skip the gradients and MoE loads are thrown
away. With several ranks (a ``RankGroup``) the loss, aux loss and MoE loads are averaged over ranks
and the gradient norm is the global one before the guard decides, so every rank decides
the same (checked).
:meth:`SpikeGuard.end_step` raises TrainingError after too many skipped steps in a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..model.distill import DistillTarget
from ..model.loop_sampling import gradient_loops
from ..precision import Precision
from ..spec.config_train import TrainConfig
from .diagnostics import ActivationProbe, gradient_metrics, model_scalars
from .distill import Teacher
from .distributed import RankGroup
from .ema import WeightsEMA
from .hooks import StepHooks
from .spike_guard import SpikeGuard

Batch = dict[str, Tensor]


@dataclass
class StepResult:
    """What one global step did (the trainer turns it into a metrics line)."""

    loss: float  # objective value (mean over micro-batches; unrolled: see unroll_losses)
    aux_loss: float
    grad_norm: float  # pre-clipping global norm (unrolled: of the last unroll run)
    loops: int
    skipped: bool
    reason: str | None = None
    grad_loops: int | None = None  # progressive backprop: the loops that carried gradients
    unroll_losses: list[float] = field(default_factory=list)
    readout_losses: dict[int, float] = field(default_factory=dict)  # deep: loss after t loops
    distill_kl: float | None = None  # train.distill: mean KL to the teacher of the readouts
    optimizer_steps: int = 0
    moe: dict[str, float] = field(default_factory=dict)
    diagnostics: dict[str, float] = field(default_factory=dict)


def unroll_bounds(loops: int, bptt: str, k: int) -> list[tuple[int, int]]:
    """``[(start, end)]`` loop ranges with their own optimizer step: one range unless
    unrolled, then every ``k`` loops (the last range may be shorter)."""
    if bptt != "unrolled":
        return [(0, loops)]
    return [(a, min(a + k, loops)) for a in range(0, loops, k)]


def _drawn(mode: str, grad_loops: int) -> int | None:
    """The gradient loops a step records: progressive backprop's draw, else none."""
    return grad_loops if mode == "progressive" else None


def guard_key(start: int, end: int) -> str:
    """The spike guard's baseline key of a loss read out over loops start+1 … end: each
    sampled loop count (and each unroll of it) is judged against losses of the same
    loops, never a deeper count's loss against a shallower one's baseline."""
    return f"{start}:{end}"


class StepRunner:
    """Runs global steps of one model/optimizer pair (built once per segment)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, train: TrainConfig,
                 guard: SpikeGuard, *, ema: WeightsEMA | None = None,
                 hooks: StepHooks | None = None, device: torch.device,
                 forward: Any = None, group: RankGroup | None = None,
                 amp: Precision | None = None, teacher: Teacher | None = None,
                 seed: int = 0) -> None:
        self.model, self.optimizer, self.train, self.guard = model, optimizer, train, guard
        self.seed = seed  # experiment.seed: progressive backprop draws its loops from it
        self.amp = amp  # autocast around forward passes (one device; FSDP has its policy)
        self.ema, self.hooks, self.device = ema, hooks or StepHooks(), device
        self.group = group  # several ranks: statistics are reduced before the guard judges
        self.forward = model if forward is None else forward  # compiled with train.compile
        self.teacher = teacher  # train.distill: scored against on every readout (.distill)
        model.activation_checkpointing = train.activation_checkpointing  # see model.recompute
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.deep = train.objective in ("deep_supervision", "answer_deep_supervision",
                                        "expected_exit")
        self.answer_only = train.objective.startswith("answer_")
        # expected_exit: Σ_t p(t)·L_t − β·H(p) over the same readouts (model.exit_gate)
        self.exit_entropy = (train.exit_entropy_weight if train.objective == "expected_exit"
                             else None)

    # ------------------------------------------------------------------ pieces

    def _objective(self, out: Any, counts: Sequence[int]) -> Tensor:
        losses = out.losses
        if self.exit_entropy is not None:
            return out.objective
        if self.deep:
            return torch.stack([losses[h] for h in counts]).mean()
        return losses[counts[-1]]

    def _grad_norm_and_clip(self) -> float:
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.group is not None:  # sharded grads: the global norm, the same on every rank
            self.group.sync_replicated_grads()
            norm = self.group.grad_norm(grads)
            if self.train.grad_clip > 0:
                self.group.clip(self.params, self.train.grad_clip, norm)
            return float(norm)
        if self.train.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.train.grad_clip,
                                                  foreach=None)
        else:
            norm = torch.nn.utils.get_total_norm(grads)
        return float(norm)

    def _apply(self) -> None:
        """The optimizer step of an accepted (unroll of a) step, then what follows it."""
        self.optimizer.step()
        self.model.update_moe_biases()
        if self.ema is not None:
            self.ema.update(self.model)

    def _discard(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.model.clear_moe_loads()

    # ------------------------------------------------------------------ the step

    def run(self, step: int, micro_batches: Sequence[Batch], loops: int, *, flat_row: int,
            diagnose: bool = False) -> StepResult:
        """Global step ``step`` (1-based) over this rank's micro-batches with ``loops`` loops.

        ``flat_row`` (where the step's data starts in the row stream) only feeds
        :meth:`StepHooks.loss`. Raises TrainingError when the guard aborts.
        """
        t = self.train
        accum = len(micro_batches)
        batches = [{k: v.to(self.device, non_blocking=True) for k, v in mb.items()}
                   for mb in micro_batches]
        bounds = unroll_bounds(loops, t.bptt.mode, t.bptt.k)
        no_grad = loops - gradient_loops(t.bptt, loops, self.seed, step)
        states: list[Tensor | None] = [None] * accum
        targets = self._teacher_targets(batches)  # once per step, shared by the unrolls
        probe = ActivationProbe(self.model) if diagnose else None
        result = StepResult(loss=math.nan, aux_loss=0.0, grad_norm=math.nan, loops=loops,
                            skipped=False, grad_loops=_drawn(t.bptt.mode, loops - no_grad))
        weighted, weight, kls = 0.0, 0, []
        for start, end in bounds:
            counts = list(range(start + 1, end + 1)) if self.deep else [end]
            sums = self._backward(batches, counts, start, no_grad, states, probe, step=step,
                                  flat_row=flat_row, keep_state=len(bounds) > 1,
                                  targets=targets)
            if probe is not None:
                result.diagnostics = gradient_metrics(self.model)  # before clipping
            # loss, aux loss and (deep supervision) each readout's loss: one host sync
            values = [v / accum for v in sums.tolist()]
            result.moe = self.model.moe_load_stats()
            if self.group is not None:  # every rank judges the same global statistics
                values = self.group.mean(values)
                result.moe = self.group.mean_dict(result.moe)
            if targets is not None:  # the readouts' mean KL to the teacher, last in the sums
                kls.append(values.pop())
            value, result.aux_loss, *readouts = values
            if self.deep:
                result.readout_losses.update(zip(counts, readouts, strict=True))
            result.grad_norm = self._grad_norm_and_clip()
            result.unroll_losses.append(value)
            # deep supervision: every readout counts once; last: the deepest readout wins
            weighted = weighted + value * len(counts) if self.deep else value
            weight = weight + len(counts) if self.deep else 1
            decision = self.guard.observe(step, value, result.grad_norm,
                                          key=guard_key(start, end))
            if self.group is not None:
                self.group.agree(decision.skip, f"skipping step {step}")
            if decision.skip:
                result.skipped, result.reason = True, decision.reason
                self._discard()
                break  # a spike drops the remaining unrolls of this global step
            self._apply()
            result.optimizer_steps += 1
        self.optimizer.zero_grad(set_to_none=True)
        result.loss = weighted / weight if weight else math.nan
        if kls:
            result.distill_kl = sum(kls) / len(kls)
        self.guard.end_step(step)
        if probe is not None:
            self._add_activations(result, probe)
        return result

    def _backward(self, batches: Sequence[Batch], counts: list[int], start: int, no_grad: int,
                  states: list[Tensor | None], probe: ActivationProbe | None, *, step: int,
                  flat_row: int, keep_state: bool,
                  targets: list[DistillTarget] | None = None) -> Tensor:
        """Forward and backward of every micro-batch for one unroll (gradients
        accumulated with weight 1/accum); returns the sums over the micro-batches of
        [loss, aux loss, (deep supervision) the loss after each of ``counts``, (distilling)
        the mean KL to the teacher of the readouts scored]."""
        t, accum = self.train, len(batches)
        self.optimizer.zero_grad(set_to_none=True)
        seg_loss = torch.zeros((), device=self.device)
        seg_aux = torch.zeros((), device=self.device)
        seg_readouts = torch.zeros(len(counts) if self.deep else 0, device=self.device)
        seg_kl = torch.zeros(0 if targets is None else 1, device=self.device)
        for m, batch in enumerate(batches):
            with (probe.attached() if probe is not None else nullcontext(),
                  self.amp.autocast() if self.amp is not None else nullcontext()):
                # a fresh embedding per unroll: the previous unroll's graph is freed
                out = self.forward(batch, counts, t.answer_weight, no_grad_loops=no_grad,
                                   start=start, state=states[m], answer_only=self.answer_only,
                                   **self._extra(targets, m))
                loss = self.hooks.loss(self._objective(out, counts), step, flat_row)
                aux = self.model.take_aux_loss()
            ((loss + aux) / accum).backward()
            if keep_state:
                states[m] = out.state.detach()
            seg_loss += loss.detach()
            seg_aux += aux.detach()
            if self.deep:  # the values the objective averaged, already computed
                seg_readouts += torch.stack([out.losses[h].detach() for h in counts])
            if targets is not None:
                seg_kl += torch.stack(targets[m].kl).mean()
                targets[m].kl.clear()
        return torch.cat([torch.stack([seg_loss, seg_aux]), seg_readouts, seg_kl])

    def _extra(self, targets: list[DistillTarget] | None, m: int) -> dict[str, Any]:
        """The forward's keywords of an objective with its own terms."""
        if self.exit_entropy is not None:
            return {"exit_entropy_weight": self.exit_entropy}
        return {} if targets is None else {"distill": targets[m]}

    def _teacher_targets(self, batches: Sequence[Batch]) -> list[DistillTarget] | None:
        """The teacher's readout of each micro-batch (train.distill), without gradients."""
        if self.teacher is None:
            return None
        with self.amp.autocast() if self.amp is not None else nullcontext():
            return [self.teacher.target(batch) for batch in batches]

    def _add_activations(self, result: StepResult, probe: ActivationProbe) -> None:
        activations = probe.metrics()
        if self.group is not None:
            activations = self.group.mean_dict(activations)
        result.diagnostics.update(activations)
        result.diagnostics.update(model_scalars(self.model))
