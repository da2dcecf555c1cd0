"""``experiment.precision`` (auto | bf16 | fp32): the compute dtype of a device, and how to apply it.

- One device: :meth:`Precision.autocast` wraps every forward pass (training, validation,
  samples, the H_eff sweep, lm-eval scoring and generation) in ``torch.autocast`` to bf16.
  Parameters, gradients, optimizer state and snapshots stay fp32 (fp32 master weights); the
  loss is computed in fp32 (``LoopedLM.readout_loss``: the head matmul in bf16, its
  logsumexp and the loss in fp32).
- FSDP2 (``train.nproc > 1``): the same dtype as the sharding's mixed-precision policy
  (``param_dtype`` bf16, gradients reduced in fp32); no autocast on top.

``auto`` is bf16 where the device does it natively (CUDA with bf16 support, an Ascend NPU
that reports it) and fp32 elsewhere, the CPU included: bf16 matmuls on a CPU without AMX are
slower than fp32. ``bf16`` on the CPU is allowed (CPU autocast), for testing the path.
A device that cannot do bf16 is a ConfigError when the stage starts, before any work.
"""

from __future__ import annotations

import importlib
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from .errors import ConfigError

PRECISION_CHOICES = ("auto", "bf16", "fp32")


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 natively (the CPU counts as not: it emulates)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "npu":
        importlib.import_module("torch_npu")
        check = getattr(getattr(torch, "npu", None), "is_bf16_supported", None)
        return True if check is None else bool(check())  # older torch_npu: trust the user
    return False


def _describe(device: torch.device) -> str:
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"{torch.cuda.get_device_name(index)} (compute capability {major}.{minor})"
    return f"this {device.type} device"


@dataclass(frozen=True)
class Precision:
    """The resolved compute dtype on one device type."""

    dtype: torch.dtype
    device_type: str

    @classmethod
    def resolve(cls, name: str, device: torch.device,
                key: str = "experiment.precision") -> Precision:
        """``name`` (the value of ``key``) on ``device``; ConfigError when the device cannot
        do it."""
        if name not in PRECISION_CHOICES:
            raise ConfigError(f"{key} = {name!r} is not allowed; use one of "
                              f"{list(PRECISION_CHOICES)}")
        if name == "fp32" or (name == "auto" and device.type == "cpu"):
            return cls(torch.float32, device.type)
        if device.type == "cpu":  # explicit bf16 on the CPU: autocast, slow but exact to test
            return cls(torch.bfloat16, device.type)
        supported = bf16_supported(device)
        if name == "bf16" and not supported:
            raise ConfigError(f"{key} = bf16 but {_describe(device)} has no native bf16; "
                              f"use {key} auto or fp32")
        return cls(torch.bfloat16 if supported else torch.float32, device.type)

    @property
    def name(self) -> str:
        """``bf16`` or ``fp32`` (what ``auto`` became)."""
        return "bf16" if self.dtype == torch.bfloat16 else "fp32"

    @property
    def mixed(self) -> bool:
        return self.dtype != torch.float32

    def autocast(self) -> AbstractContextManager:
        """``torch.autocast`` to the compute dtype (a no-op context in fp32)."""
        if not self.mixed:
            return nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


def fp32(device: torch.device) -> Precision:
    """Plain fp32 on ``device`` (no autocast)."""
    return Precision(torch.float32, device.type)

