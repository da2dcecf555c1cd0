"""Batch plan: global batch rows = micro-batch rows × accumulation steps × world size.

Data order is global (DESIGN § Data formats): optimizer step ``s`` consumes rows
``[s·G, (s+1)·G)`` of the epoch stream, whatever the world size. Within a step, rank ``r``
takes the contiguous block ``[r·R, (r+1)·R)`` (``R = micro × accum`` rows per rank) and its
micro-batch ``m`` the rows ``[r·R + m·micro, r·R + (m+1)·micro)`` (cut by
:meth:`~pipeline_lib.data.loader.PackedData.batches_for_step`). A resumed run on another
world size therefore reads the same rows; only the reduction order of gradients changes.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..spec.config_train import TrainConfig


@dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's rows are split over ranks and micro-batches."""

    global_batch_rows: int
    micro_batch_rows: int
    world_size: int
    accum_steps: int

    def tokens_per_step(self, seq_len: int) -> int:
        """Input tokens per optimizer step over all ranks (padding included)."""
        return self.global_batch_rows * seq_len



def _multiples_near(value: int, unit: int) -> str:
    lower = value // unit * unit
    options = [m for m in (lower, lower + unit) if m > 0]
    return " or ".join(str(m) for m in options)


def make_batch_plan(train: TrainConfig, world_size: int | None = None) -> BatchPlan:
    """Validate and build the plan; ``world_size`` defaults to ``train.nproc``.

    The actual world size (from torchrun) may differ from ``train.nproc`` on a resume with
    another process count; the global batch stays what the config says.
    """
    world = train.nproc if world_size is None else world_size
    g, micro = train.global_batch_rows, train.micro_batch_rows
    if world < 1:
        raise ConfigError(f"world size {world} (train.nproc or torchrun's processes) must be at "
                          "least 1")
    if micro < 1 or g < 1:
        raise ConfigError(f"train.micro_batch_rows = {micro} and train.global_batch_rows = {g} "
                          "must both be at least 1")
    per_pass = micro * world
    if g < per_pass:
        fix = (f"lower train.micro_batch_rows to {g // world}" if g >= world and g % world == 0
               else f"raise train.global_batch_rows to {per_pass}")
        raise ConfigError(f"train.global_batch_rows = {g} is smaller than train.micro_batch_rows "
                          f"× world size = {micro} × {world}; {fix}")
    if g % per_pass:
        raise ConfigError(f"train.global_batch_rows = {g} is not a multiple of "
                          f"train.micro_batch_rows × world size = {micro} × {world}; use "
                          f"train.global_batch_rows = {_multiples_near(g, per_pass)}, or a "
                          "micro_batch_rows that divides the rows per rank")
    return BatchPlan(global_batch_rows=g, micro_batch_rows=micro, world_size=world,
                     accum_steps=g // per_pass)
