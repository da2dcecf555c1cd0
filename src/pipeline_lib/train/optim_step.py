"""The step every optimizer of the trainer's own writes (:class:`~.muon.MuonAdamW`,
:class:`~.optim.AdamATan2`) shares: torch's ``closure`` protocol, then the update."""

from __future__ import annotations

from collections.abc import Callable

import torch


class ClosureStep(torch.optim.Optimizer):
    """``step(closure)`` as torch's optimizers do it: the closure (if any) re-evaluates the
    loss with gradients on, then :meth:`update` runs without autograd; returns the loss."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.update()
        return loss

    def update(self) -> None:
        """One update of every parameter from its ``.grad`` (under ``torch.no_grad``)."""
        raise NotImplementedError
