"""What the linear layers of a running stage compute on: torch's global forward hook records
the device and dtype of every ``nn.Linear`` input and output (nothing is replaced)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def linear_calls() -> Iterator[list[tuple[str, str, torch.dtype]]]:
    """Yields a list that fills with (input device type, output device type, output dtype)
    of every ``nn.Linear`` call made inside the ``with`` block."""
    seen: list[tuple[str, str, torch.dtype]] = []

    def hook(module: nn.Module, args: tuple, output: object) -> None:
        if isinstance(module, nn.Linear) and isinstance(output, torch.Tensor):
            seen.append((args[0].device.type, output.device.type, output.dtype))

    handle = nn.modules.module.register_module_forward_hook(hook)
    try:
        yield seen
    finally:
        handle.remove()
