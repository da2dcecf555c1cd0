"""Exponential moving average of the weights, saved in the snapshot as ``ema.safetensors``.

``shadow ← decay·shadow + (1 − decay)·weights`` after every optimizer step that was taken
(skipped steps leave it alone, like the weights). Floating-point trainable parameters are
averaged; buffers and frozen tensors are copied as they are, so :meth:`WeightsEMA.state_dict`
has exactly the keys of ``model.state_dict()`` and evaluation can load it into the model
(``eval.use_ema``). Tied tensors are averaged once and stay tied.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError


class WeightsEMA:
    """EMA of a model's weights; ``update(model)`` after each optimizer step."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"train.ema_decay = {decay} must be in (0, 1) to keep an EMA "
                              "(0 turns it off)")
        self.decay = decay
        live = model.state_dict(keep_vars=True)
        self._canonical: dict[str, str] = {}  # state_dict key → key holding the shadow tensor
        seen: dict[int, str] = {}
        for name, t in live.items():
            self._canonical[name] = seen.setdefault(id(t), name)
        self.shadow: dict[str, torch.Tensor] = {
            name: live[name].detach().clone() for name in set(self._canonical.values())}
        self._averaged = sorted(
            name for name in self.shadow
            if isinstance(live[name], nn.Parameter) and live[name].requires_grad
            and live[name].is_floating_point())
        self._copied = sorted(set(self.shadow) - set(self._averaged))
        self.num_updates = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Blend the model's current weights into the average."""
        live = model.state_dict(keep_vars=True)
        # foreach over one tensor kind at a time: FSDP-sharded (DTensor) and plain tensors
        # (replicated scalars) cannot share a list; elementwise, so the result is the same
        for names in _by_kind(self._averaged, self.shadow):
            torch._foreach_lerp_([self.shadow[n] for n in names],
                                 [live[n].detach() for n in names], 1.0 - self.decay)
        for name in self._copied:
            self.shadow[name].copy_(live[name])
        self.num_updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{state_dict key: averaged tensor}`` (tied keys share one tensor)."""
        return {name: self.shadow[canon] for name, canon in self._canonical.items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if set(state) != set(self._canonical):
            missing = sorted(set(self._canonical) - set(state))[:5]
            extra = sorted(set(state) - set(self._canonical))[:5]
            raise CheckpointError(f"EMA weights do not match the model (missing {missing}, "
                                  f"unexpected {extra}); the model changed: start a fresh EMA")
        for canon in self.shadow:
            if state[canon].shape != self.shadow[canon].shape:
                raise CheckpointError(f"EMA tensor {canon} has shape {tuple(state[canon].shape)}, "
                                      f"the model {tuple(self.shadow[canon].shape)}; start a fresh "
                                      "EMA")
            self.shadow[canon].copy_(state[canon])


def _by_kind(names: list[str], tensors: dict[str, torch.Tensor]) -> list[list[str]]:
    """``names`` split into lists of one tensor type each (order kept), empty ones dropped."""
    kinds: dict[type, list[str]] = {}
    for name in names:
        kinds.setdefault(type(tensors[name]), []).append(name)
    return list(kinds.values())
