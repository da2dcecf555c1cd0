"""Data-parallel training under torchrun: process group, FSDP2 sharding, the collectives.

One process per device (``torchrun --nproc_per_node N``); the data order stays global (see
:mod:`.batch_plan`), so each rank only has to agree with the others on three things:

- the weights: :func:`shard_model` applies ``fully_shard`` to every transformer block and
  then to the root (FSDP2: parameters are DTensors sharded on dim 0, all-gathered per block
  for compute, gradients reduce-scattered and averaged over ranks). Compute in the dtype of
  ``experiment.precision`` (bf16: gradients still reduced in fp32). FSDP2 cannot shard a 0-dim
  parameter (the learnable λ), so those stay replicated and :class:`RankGroup` averages
  their gradients by hand;
- the step's statistics: loss, aux loss, gradient norm and the diagnostics are reduced
  across ranks *before* the spike guard judges them, so every rank takes the same skip
  decision (and :meth:`RankGroup.agree` checks that it did);
- the snapshot: written collectively (see :mod:`pipeline_lib.checkpoint.sharded`).

Only rank 0 logs at INFO, shows progress and writes run-level files.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..device import (
    device_for_rank,
    dist_backend,
    exact_float_dtype,
    flagged_ranks,
    resolve_device,
)
from ..errors import ConfigError, TrainingError
from ..precision import Precision

log = logging.getLogger(__name__)

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
# root methods that read weights outside forward(): evaluation, generation with the KV cache
FORWARD_METHODS = ("logits_by_loops", "prefill", "decode_step")


def launched_by_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """True in a process that torchrun (torch.distributed.run) started."""
    env = os.environ if env is None else env
    return all(name in env for name in TORCHRUN_ENV)


@dataclass(frozen=True)
class DistContext:
    """Who this process is in the job, and what it computes on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def init_process_group(device_name: str, env: Mapping[str, str] | None = None) -> DistContext:
    """Join the torchrun job: the backend of ``experiment.device`` (gloo on the CPU, nccl
    on CUDA, hccl on Ascend) and this local rank's device. Idempotent."""
    env = os.environ if env is None else env
    rank, world, local = (int(env[name]) for name in TORCHRUN_ENV)
    device = device_for_rank(resolve_device(device_name), local)
    backend = dist_backend(device)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=rank, world_size=world)
    if rank != 0:  # one voice per job: the other ranks report warnings and errors only
        logging.getLogger("pipeline_lib").setLevel(logging.WARNING)
    log.info("rank %d/%d (local %d) on %s, backend %s", rank, world, local, device, backend)
    return DistContext(rank=rank, world_size=world, local_rank=local, device=device,
                       backend=backend)


def local_device(device_name: str) -> torch.device:
    """``experiment.device`` as this process's device (its local rank's accelerator)."""
    return device_for_rank(resolve_device(device_name), int(os.environ.get("LOCAL_RANK", "0")))


def destroy_process_group() -> None:
    """Leave the job (best effort at the end of a run)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def is_distributed() -> bool:
    """A process group with more than one rank is up."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def shards_model(world_size: int) -> bool:
    """Whether training shards the model with FSDP2: several ranks, or one rank inside a
    process group (``torchrun --nproc_per_node 1``, the device check's one-rank segment)."""
    return world_size > 1 or (dist.is_available() and dist.is_initialized())


def process_device(device_name: str, world_size: int, rank: int) -> torch.device:
    """This process's device: ``experiment.device``, and with several ranks the local
    rank's own accelerator (the process group must be up: torchrun + the train command)."""
    if world_size == 1:
        return resolve_device(device_name)
    if not is_distributed() or dist.get_world_size() != world_size:
        raise ConfigError(f"world size {world_size} needs a torch.distributed process group of "
                          "that size; run through torchrun (pipeline_lib.train.launch."
                          "run_training_job with train.nproc > 1)")
    if dist.get_rank() != rank:
        raise ConfigError(f"rank {rank} given, but this process is rank {dist.get_rank()} of "
                          "the process group; pass world_size/rank from the group")
    return local_device(device_name)


# --------------------------------------------------------------------------- sharding


def shard_model(model: nn.Module, precision: Precision) -> list[nn.Parameter]:
    """FSDP2 in place: ``fully_shard`` each block of prelude/core/coda, then the root.

    A core block runs once per loop; FSDP2 all-gathers it for each use and reduce-scatters
    its accumulated gradient. ``precision`` (``experiment.precision`` resolved) sets the
    compute dtype of the gathered parameters; gradients are reduced in fp32. Returns the
    parameters left replicated (0-dim ones).
    """
    # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
    from torch.distributed.fsdp import (
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    # with the FSDP imports above: only the sharding path needs it
    from .diagnostics import named_blocks

    mp = (MixedPrecisionPolicy(param_dtype=precision.dtype, reduce_dtype=torch.float32)
          if precision.mixed else MixedPrecisionPolicy())
    replicated = [p for p in model.parameters() if p.ndim == 0]
    for _, block in named_blocks(model):
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp, ignored_params=set(replicated) or None)
    for name in FORWARD_METHODS:
        if hasattr(model, name):
            register_fsdp_forward_method(model, name)
    if replicated:
        log.info("%d scalar parameter(s) kept replicated (FSDP2 shards only ≥1-dim ones)",
                 len(replicated))
    return replicated


def reshard(model: nn.Module) -> None:
    """Put every FSDP module back into its sharded state.

    The root is not resharded after a forward without backward (validation, generation),
    and while unsharded its registered parameters are not the optimizer's DTensors; call
    this before anything reads parameters (optimizer step, state dicts).
    """
    # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor (an FSDP2 shard), not a plain tensor."""
    # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


# --------------------------------------------------------------------------- collectives


@dataclass
class RankGroup:
    """The collectives of one training process; the trainer holds one when world > 1."""

    world_size: int
    rank: int
    device: torch.device  # where collective buffers live (the CPU for gloo)
    replicated: list[nn.Parameter] = field(default_factory=list)

    @classmethod
    def current(cls, device: torch.device,
                replicated: Sequence[nn.Parameter] = ()) -> RankGroup:
        return cls(world_size=dist.get_world_size(), rank=dist.get_rank(), device=device,
                   replicated=list(replicated))

    def mean(self, values: Sequence[float]) -> list[float]:
        """Elementwise mean over ranks (one all-reduce; float64 keeps the sums exact, float32
        on an Ascend NPU, which has no float64)."""
        buf = torch.tensor(list(values), dtype=exact_float_dtype(self.device), device=self.device)
        dist.all_reduce(buf)
        return (buf / self.world_size).tolist()

    def mean_dict(self, values: Mapping[str, float]) -> dict[str, float]:
        """Mean over ranks of a dict whose keys are the same on every rank."""
        keys = sorted(values)
        return dict(zip(keys, self.mean([values[k] for k in keys]), strict=True))

    def sync_replicated_grads(self) -> None:
        """Average the gradients FSDP does not manage (scalars), as it averages the rest."""
        for p in self.replicated:
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    def grad_norm(self, grads: Sequence[Tensor]) -> Tensor:
        """Global L2 norm of sharded (DTensor) and replicated gradients, same on all ranks."""
        sharded = [g for g in grads if is_dtensor(g)]
        plain = [g for g in grads if not is_dtensor(g)]
        sq = torch.zeros((), dtype=torch.float32, device=self.device)
        if sharded:
            norm = torch.nn.utils.get_total_norm(sharded)
            sq = sq + norm.full_tensor().to(self.device).float() ** 2
        if plain:  # replicated and already averaged: every rank holds the same values
            sq = sq + torch.nn.utils.get_total_norm(plain).to(self.device).float() ** 2
        return sq.sqrt()

    def clip(self, params: Sequence[nn.Parameter], max_norm: float, total: Tensor) -> None:
        """Scale every gradient by ``max_norm / total`` when above (foreach per tensor kind)."""
        sharded = [p for p in params if p.grad is not None and is_dtensor(p.grad)]
        plain = [p for p in params if p.grad is not None and not is_dtensor(p.grad)]
        for group in (sharded, plain):
            if group:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=None)

    def agree(self, flag: bool, what: str) -> None:
        """Raise TrainingError unless every rank reached the same ``flag``."""
        buf = torch.tensor([int(flag)], dtype=torch.int64, device=self.device)
        dist.all_reduce(buf)
        votes = int(buf.item())
        if votes not in (0, self.world_size):
            raise TrainingError(f"ranks disagree on {what} ({votes} of {self.world_size} said "
                                "yes); the replicas diverged, resume from the last snapshot")

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one."""
        return bool(flagged_ranks(flag, self.device))

    def barrier(self) -> None:
        dist.barrier()
