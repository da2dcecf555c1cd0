"""Resolve ``experiment.device`` (auto | cpu | cuda | npu) to a ``torch.device``.

``auto`` picks CUDA when present, then an Ascend NPU when ``torch_npu`` is installed and
sees a device, else the CPU. ``torch_npu`` is imported only when an NPU is asked for or
probed, so CPU and CUDA runs never need it.

For multi-process training, :func:`device_for_rank` pins a process to its local
accelerator, :func:`dist_backend` names the collective backend of a device type
(nccl for CUDA, hccl for Ascend, gloo for the CPU) and :func:`flagged_ranks` tells every
rank which ranks raised a flag.
"""

from __future__ import annotations

import importlib
import logging

import torch
import torch.distributed as dist

from .errors import DeviceError

log = logging.getLogger(__name__)

DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")


def _npu_module(required: bool):
    """``torch.npu`` after importing ``torch_npu`` (which registers it), or None."""
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        if required:
            raise DeviceError("experiment.device = 'npu' needs torch_npu, which is not "
                              "installed; install it with pip install -e '.[npu]' or use "
                              "experiment.device: cpu") from None
        return None
    return getattr(torch, "npu", None)


def resolve_device(name: str) -> torch.device:
    """The torch device for ``experiment.device``; DeviceError when it is not available."""
    if name not in DEVICE_CHOICES:
        raise DeviceError(f"experiment.device = {name!r} is not allowed; use one of "
                          f"{list(DEVICE_CHOICES)}")
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError("experiment.device = 'cuda' but torch sees no CUDA device; use "
                              "experiment.device: auto or cpu, or install a CUDA build of torch")
        return torch.device("cuda")
    if name == "npu":
        npu = _npu_module(required=True)
        if npu is None or not npu.is_available():
            raise DeviceError("experiment.device = 'npu' but torch_npu sees no NPU; use "
                              "experiment.device: auto or cpu")
        return torch.device("npu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    npu = _npu_module(required=False)
    if npu is not None and npu.is_available():
        return torch.device("npu")
    return torch.device("cpu")


DIST_BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}
FLOAT64_DEVICES = frozenset({"cpu", "cuda"})  # Ascend NPUs compute no float64


def _device_type(device: torch.device | str) -> str:
    return device if isinstance(device, str) else device.type


def dist_backend(device: torch.device | str) -> str:
    """The torch.distributed backend for processes computing on ``device`` (or device type)."""
    kind = _device_type(device)
    try:
        return DIST_BACKENDS[kind]
    except KeyError:
        raise DeviceError(f"no collective backend for device type {kind!r}; use "
                          "experiment.device: cpu, cuda or npu") from None


def exact_float_dtype(device: torch.device | str) -> torch.dtype:
    """The widest float dtype ``device`` computes in: float64, float32 on an Ascend NPU.

    For tensors that must live on the device (collective buffers); anything that can be
    computed on the CPU in float64 first should be (RoPE tables, MoE loads)."""
    return torch.float64 if _device_type(device) in FLOAT64_DEVICES else torch.float32


def device_for_rank(device: torch.device, local_rank: int) -> torch.device:
    """The device of local rank ``local_rank`` (its own accelerator; the CPU is shared).

    Sets it as the current device, so collectives and kernels without an explicit index
    land on it. DeviceError when the node has fewer accelerators than local ranks.
    """
    if device.type == "cpu":
        return device
    module = torch.cuda if device.type == "cuda" else getattr(torch, "npu", None)
    count = module.device_count() if module is not None else 0
    if local_rank >= count:
        raise DeviceError(f"local rank {local_rank} needs its own {device.type} device but "
                          f"{count} are visible; lower train.nproc to {count} or request more "
                          "devices (resources.train_gpus)")
    module.set_device(local_rank)
    return torch.device(device.type, local_rank)


def flagged_ranks(flag: bool, device: torch.device) -> list[int]:
    """Collective: the ranks whose ``flag`` is true, in order, on every rank.

    Each rank sets its own slot of a world-size vector and one all-reduce sums them, so
    every rank learns which ranks raised the flag (and so whether any did) in one call.
    """
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=device)
    flags[dist.get_rank()] = int(bool(flag))
    dist.all_reduce(flags)
    return [rank for rank, raised in enumerate(flags.tolist()) if raised]


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels (timing); a no-op on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize()  # type: ignore[attr-defined]
