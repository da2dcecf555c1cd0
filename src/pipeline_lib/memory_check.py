"""Refuse a config too big for the machine before anything is allocated.

:func:`check_memory` compares an estimate of :mod:`pipeline_lib.spec.memory` (a lower bound)
with what the device has free and raises one :class:`~pipeline_lib.errors.ConfigError` line
naming both when the estimate exceeds it: without it such a config allocated until a native
traceback or the kernel's OOM killer. What is available:

- **CPU**: ``MemAvailable`` + ``SwapFree`` of ``/proc/meminfo``, and no more than the memory
  cgroup leaves (v2 ``memory.max`` − ``anon``, v1 ``memory.limit_in_bytes`` − ``total_rss``;
  page cache counts as available, since the kernel drops it before it refuses);
- **CUDA**: the free memory of the device (``torch.cuda.mem_get_info``), other processes'
  share already taken; **NPU**: the same through ``torch_npu`` where it tells;
- anything else, or a figure the system does not give: no check.

Since the estimate is a lower bound and swap and cache count as available, only a config
that cannot run is refused.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from .errors import ConfigError
from .spec.config import Config
from .spec.memory import MemoryEstimate, format_bytes, training_memory

log = logging.getLogger(__name__)

MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _stat(path: Path, key: str) -> int | None:
    """The value of ``key`` in a cgroup's ``memory.stat``."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def cgroup_available(root: Path = CGROUP_ROOT) -> int | None:
    """What the memory cgroup mounted at ``root`` still lets this process allocate (None:
    no limit, or no cgroup to read): the limit less the anonymous memory already used."""
    found = []
    v2 = _read_int(root / "memory.max")  # "max" (no limit) reads as None
    if v2 is not None:
        found.append(v2 - (_stat(root / "memory.stat", "anon") or 0))
    v1 = _read_int(root / "memory" / "memory.limit_in_bytes")
    if v1 is not None and v1 < _UNLIMITED:
        found.append(v1 - (_stat(root / "memory" / "memory.stat", "total_rss") or 0))
    return max(0, min(found)) if found else None


def host_available(meminfo: Path = MEMINFO,
                   cgroup_root: Path = CGROUP_ROOT) -> tuple[int, str] | None:
    """(bytes, where the figure comes from) of the host's memory this process may still use."""
    values = {}
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                values[name] = int(fields[0]) * 1024  # kB
    except OSError:
        return None
    if "MemAvailable" not in values:
        return None
    free = values["MemAvailable"] + values.get("SwapFree", 0)
    source = "MemAvailable + SwapFree" if values.get("SwapFree") else "MemAvailable"
    limit = cgroup_available(cgroup_root)
    if limit is not None and limit < free:
        return limit, "the memory cgroup's limit less its use"
    return free, source


def available_memory(device: torch.device) -> tuple[int, str, str] | None:
    """(bytes free, where the figure comes from, what has them) on ``device``; None when
    the device does not tell (then nothing is refused)."""
    if device.type == "cpu":
        found = host_available()
        return None if found is None else (*found, "this machine")
    module = getattr(torch, device.type, None)
    if device.type not in ("cuda", "npu") or not hasattr(module, "mem_get_info"):
        return None
    index = device.index if device.index is not None else module.current_device()
    free, _total = module.mem_get_info(index)
    return int(free), "free device memory", f"{device.type}:{index}"


def local_processes() -> int:
    """Processes of this job on this host (torchrun's ``LOCAL_WORLD_SIZE``; 1 without)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def check_memory(estimate: MemoryEstimate, device: torch.device, what: str,
                 available: tuple[int, str, str] | None = None) -> None:
    """Raise one ConfigError line when ``estimate`` (at least ``estimate.total`` bytes for
    ``what``, e.g. ``training``) exceeds the memory free on ``device`` (``available``:
    measured here unless given)."""
    found = available_memory(device) if available is None else available
    if found is None:
        log.debug("memory check of %s skipped: %s tells no free memory", what, device)
        return
    free, source, holder = found
    if estimate.total <= free:
        return
    raise ConfigError(f"{estimate.subject}: {what} needs at least "
                      f"{format_bytes(estimate.total)} of memory ({estimate.describe()}), but "
                      f"{holder} has {format_bytes(free)} available ({source}); "
                      f"{estimate.fix}")


def check_training_memory(cfg: Config, device: torch.device, world_size: int = 1) -> None:
    """Before a segment builds its model: :func:`check_memory` of
    :func:`~pipeline_lib.spec.memory.training_memory` on this rank's ``device``. On the CPU
    the ranks of this host share its memory, so their sum is checked, and every rank waits
    for the others' check (a barrier) so that none allocates while another still measures."""
    accelerator = device.type != "cpu"
    processes = 1 if accelerator else min(local_processes(), world_size)
    check_memory(training_memory(cfg, world_size=world_size, processes=processes,
                                 accelerator=accelerator), device, "training")
    if processes > 1 and dist.is_available() and dist.is_initialized():
        dist.barrier()


__all__ = ["available_memory", "cgroup_available", "check_memory", "check_training_memory",
           "host_available", "local_processes"]
