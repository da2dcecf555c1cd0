"""Muon on the hidden matrices and AdamW on the rest, as ONE ``torch.optim.Optimizer``.

Muon (Keller Jordan 2024, https://kellerjordan.github.io/posts/muon/) orthogonalizes each
matrix's Nesterov momentum by a Newton–Schulz iteration; it is meant for 2-D hidden
weights only, so embeddings, norms, the head, the injection adapter, λ and the MoE router
keep AdamW (as McLeish et al. 2025 do when retrofitting recurrence). The trainer expects
one optimizer (param groups with ``name``/``peak_lr``/``weight_decay``, one
``state_dict``), so :class:`MuonAdamW` holds every group and all state itself and
delegates the arithmetic to torch:

- the Muon group (``name == "muon"``) goes through torch 2.13's functional
  ``torch.optim._muon.muon``, the exact function ``torch.optim.Muon.step`` calls (momentum,
  Nesterov, Newton–Schulz, lr adjustment, decoupled weight decay; tested bit for bit against
  ``torch.optim.Muon``). Calling the functional rather than a ``torch.optim.Muon`` lets a
  3-D MoE expert stack ``[E, in, out]`` be updated as E independent matrices: each
  expert's slice is passed as a transposed view ``[out, in]`` (the ``nn.Linear`` layout the
  lr adjustment assumes) of the weight, its gradient and its momentum buffer, which are
  updated in place. Per-group state: ``momentum_buffer`` shaped like the parameter;
- every other group goes through an AdamW (``EagerAdamW`` or ``torch.optim.AdamW``) built
  over the very same group dicts and sharing this optimizer's ``state``: its arithmetic and
  state (``step``, ``exp_avg``, ``exp_avg_sq``) are those of plain AdamW. Loading a state
  dict replaces the group dicts and the state, so the view is re-pointed before each step.

Newton–Schulz constants are torch's defaults (5 steps, Keller Jordan's coefficients); the
per-matrix lr scale is ``train.muon_adjust_lr``. One process only: FSDP's sharded DTensors
would need each matrix gathered first (refused by the config and here).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.optim import _muon

from ..errors import ConfigError
from .optim_step import ClosureStep

MUON_GROUP = "muon"
NS_COEFFICIENTS = (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C)


class MuonAdamW(ClosureStep):
    """Muon on the group named :data:`MUON_GROUP`, AdamW on the others (see module doc)."""

    def __init__(self, params: Iterable[dict[str, Any]], *, adamw: type[torch.optim.AdamW],
                 lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 momentum: float, adjust_lr_fn: str):
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay))
        for group in self._groups(muon=True):
            group.setdefault("momentum", momentum)
            group.setdefault("adjust_lr_fn", adjust_lr_fn)
            for p in group["params"]:
                if p.ndim not in (2, 3) or type(p).__name__ == "DTensor":
                    raise ConfigError(f"train.optimizer = muon got a {tuple(p.shape)} "
                                      f"{type(p).__name__} in its matrix group; Muon takes "
                                      "plain 2-D matrices or 3-D expert stacks in one process: "
                                      "set train.nproc=1 or use adamw")
        rest = self._groups(muon=False)
        self._adamw = adamw(rest, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay) \
            if rest else None

    def _groups(self, *, muon: bool) -> list[dict[str, Any]]:
        return [g for g in self.param_groups if (g["name"] == MUON_GROUP) == muon]

    def update(self) -> None:
        if self._adamw is not None:
            self._adamw.param_groups = self._groups(muon=False)  # after load_state_dict too
            self._adamw.state = self.state
            self._adamw.step()
        for group in self._groups(muon=True):
            self._muon_step(group)

    def _muon_step(self, group: dict[str, Any]) -> None:
        params, grads, bufs = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            if p.ndim == 2:
                params.append(p)
                grads.append(p.grad)
                bufs.append(buf)
            else:  # [E, in, out]: E matrices, each as its [out, in] view
                params.extend(p.mT.unbind(0))
                grads.extend(p.grad.mT.unbind(0))
                bufs.extend(buf.mT.unbind(0))
        if params:
            _muon.muon(params, grads, bufs, lr=group["lr"], weight_decay=group["weight_decay"],
                       momentum=group["momentum"], nesterov=True,
                       ns_coefficients=NS_COEFFICIENTS, ns_steps=_muon.DEFAULT_NS_STEPS,
                       eps=_muon.EPS, adjust_lr_fn=group["adjust_lr_fn"], has_complex=False)
