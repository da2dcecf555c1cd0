"""Optimizers: parameter groups (who gets weight decay, λ's own lr), AdamW and AdamATan2.

Groups, each a dict with ``name``, ``peak_lr`` (read by :class:`~.schedule.LRSchedule`) and
``weight_decay``; empty groups are left out:

- ``decay``: matrices and higher-rank weights (attention, FFN, experts, router, head);
- ``no_decay``: norms' weights, biases, embeddings (token and per-loop step embeddings,
  and a head tied to the token embedding), any parameter with fewer than 2 dimensions;
- ``injection_scale``: parameters whose name contains ``injection_scale`` (the learnable λ),
  no decay, peak lr ``train.injection_lr`` (0 = ``train.lr``);
- ``muon`` (``train.optimizer = muon`` only): the hidden matrices, taken out of ``decay``:
  2-D and 3-D (MoE expert stacks) weights of the ``prelude``/``core``/``coda`` blocks
  except the MoE router; decay ``train.weight_decay``, peak lr ``train.muon_lr``
  (0 = ``train.lr``); updated by Muon (:mod:`.muon`), every other group by AdamW.

Every peak lr is scaled by ``train.lr_scaling`` from ``train.reference_batch_rows`` to the
global batch. Resuming: ``optimizer.load_state_dict`` restores the *snapshot's* group
hyper-parameters; :func:`load_optimizer_state` loads and then re-applies the current
config's (peak lr, weight decay may legitimately change between segments).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, ConfigError
from ..spec.config_train import TrainConfig
from .eager import EagerAdamW, skip_dynamo_import
from .muon import MUON_GROUP, MuonAdamW
from .optim_step import ClosureStep
from .schedule import scale_lr

GROUP_ORDER = ("decay", "no_decay", "injection_scale", MUON_GROUP)
INJECTION_MARK = "injection_scale"
HIDDEN_STACKS = ("prelude", "core", "coda")  # LoopedLM's block lists
ROUTER_MARK = "router"


def _is_no_decay_module(module: nn.Module) -> bool:
    return isinstance(module, nn.Embedding) or type(module).__name__.endswith("Norm")


def _is_hidden_matrix(name: str, p: nn.Parameter) -> bool:
    return (name.split(".", 1)[0] in HIDDEN_STACKS and p.ndim in (2, 3)
            and ROUTER_MARK not in name)


def classify_parameters(model: nn.Module, *, muon: bool = False
                        ) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """``{group name: [(parameter name, parameter)]}`` for trainable parameters (see module doc);
    ``muon``: the blocks' hidden matrices form the ``muon`` group.

    A parameter shared by several modules (tied embedding and head) appears once, under its
    first name, and is ``no_decay`` when any owner is an embedding or a norm.
    """
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for local, p in module.named_parameters(recurse=False):
            owners.setdefault(id(p), []).append((module, local))
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in GROUP_ORDER}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if INJECTION_MARK in name:
            group = "injection_scale"
        elif (p.ndim < 2 or "embed" in name.lower()
              or any(_is_no_decay_module(m) or "bias" in local for m, local in owners[id(p)])):
            group = "no_decay"
        else:
            group = MUON_GROUP if muon and _is_hidden_matrix(name, p) else "decay"
        groups[group].append((name, p))
    return {g: ps for g, ps in groups.items() if ps}


def _group_hparams(name: str, train: TrainConfig, global_batch_rows: int) -> dict[str, Any]:
    own = {"injection_scale": train.injection_lr, MUON_GROUP: train.muon_lr}.get(name, 0.0)
    peak = scale_lr(own or train.lr, global_batch_rows, train.reference_batch_rows,
                    train.lr_scaling)
    out: dict[str, Any] = {"peak_lr": peak, "weight_decay": (
        train.weight_decay if name in ("decay", MUON_GROUP) else 0.0)}
    if name == MUON_GROUP:
        out.update(momentum=train.muon_momentum, adjust_lr_fn=train.muon_adjust_lr)
    return out


def param_groups(model: nn.Module, train: TrainConfig, *,
                 global_batch_rows: int | None = None) -> list[dict[str, Any]]:
    """Optimizer parameter groups with ``name``, ``peak_lr``, ``lr`` and ``weight_decay``."""
    g = train.global_batch_rows if global_batch_rows is None else global_batch_rows
    out = []
    for name, params in classify_parameters(model, muon=train.optimizer == "muon").items():
        hp = _group_hparams(name, train, g)
        out.append({"params": [p for _, p in params], "name": name, "lr": hp["peak_lr"], **hp})
    if not out:
        raise ConfigError("the model has no trainable parameters; nothing to optimize: "
                          "leave parts out of train.freeze")
    return out


def build_optimizer(model: nn.Module, train: TrainConfig, *,
                    global_batch_rows: int | None = None) -> torch.optim.Optimizer:
    """AdamW, AdamATan2 or Muon + AdamW (``train.optimizer``) over :func:`param_groups`.

    Without ``train.compile`` they skip torch's ``torch._dynamo`` import (see :mod:`.eager`):
    the same arithmetic, about 1.1 s less per process."""
    if not train.compile:
        skip_dynamo_import()
    groups = param_groups(model, train, global_batch_rows=global_batch_rows)
    betas = (train.beta1, train.beta2)
    adamw = torch.optim.AdamW if train.compile else EagerAdamW
    if train.optimizer == "adamw":
        return adamw(groups, lr=train.lr, betas=betas, eps=train.eps,
                     weight_decay=train.weight_decay)
    if train.optimizer == "muon":
        return MuonAdamW(groups, adamw=adamw, lr=train.lr, betas=betas, eps=train.eps,
                         weight_decay=train.weight_decay, momentum=train.muon_momentum,
                         adjust_lr_fn=train.muon_adjust_lr)
    if train.optimizer == "adamatan2":
        return AdamATan2(groups, lr=train.lr, betas=betas, weight_decay=train.weight_decay)
    raise ConfigError(f"train.optimizer = {train.optimizer!r} is unknown; use adamw, "
                      "adamatan2 or muon")


def refresh_group_hparams(optimizer: torch.optim.Optimizer, train: TrainConfig, *,
                          global_batch_rows: int | None = None) -> None:
    """Set every group's ``peak_lr``, ``weight_decay``, betas and eps (Muon's: momentum and
    lr adjustment) from the current config."""
    g = train.global_batch_rows if global_batch_rows is None else global_batch_rows
    for group in optimizer.param_groups:
        group.update(_group_hparams(group["name"], train, g))
        if group["name"] != MUON_GROUP:
            group["betas"] = (train.beta1, train.beta2)
        if "eps" in group:
            group["eps"] = train.eps


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         train: TrainConfig, *, global_batch_rows: int | None = None,
                         source: str = "the snapshot") -> None:
    """``optimizer.load_state_dict(state)`` with clear errors, then :func:`refresh_group_hparams`."""
    saved = [g.get("name") for g in state.get("param_groups", [])]
    built = [g.get("name") for g in optimizer.param_groups]
    if saved != built:
        raise CheckpointError(f"optimizer state in {source} has parameter groups {saved}, the "
                              f"model gives {built}; the model changed: warm-start weights only")
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"optimizer state in {source} does not fit this model/optimizer "
                              f"({exc}); resume with the snapshot's config or warm-start weights "
                              "only") from None
    refresh_group_hparams(optimizer, train, global_batch_rows=global_batch_rows)


class AdamATan2(ClosureStep):
    """Adam with ``atan2`` in place of the division by ``√v̂ + ε`` (no ε at all).

    Per parameter, at step t (Everett et al. 2024, "Scaling Exponents Across
    Parameterizations and Optimizers", arXiv:2407.05872, Adam-atan2)::

        p ← p · (1 − lr·weight_decay)                 # decoupled, as in AdamW
        m ← β1·m + (1 − β1)·g ;  v ← β2·v + (1 − β2)·g²
        m̂ = m / (1 − β1^t) ;    v̂ = v / (1 − β2^t)
        p ← p − lr · a · atan2(m̂, b·√v̂)

    ``atan2`` is bounded (|update| ≤ lr·a·π/2), invariant to rescaling the gradient, and
    well defined at ``m̂ = v̂ = 0``. ``a = 1.27, b = 1`` follow the reference PyTorch
    implementation (lucidrains/adam-atan2-pytorch), so the update magnitude matches Adam's
    ``m̂/√v̂`` near typical values.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0,
                 a: float = 1.27, b: float = 1.0):
        if lr <= 0 or weight_decay < 0 or not all(0.0 <= x < 1.0 for x in betas):
            raise ConfigError(f"AdamATan2: lr = {lr} must be > 0, weight_decay = {weight_decay} "
                              f">= 0 and betas = {betas} in [0, 1); fix train.lr/beta1/beta2")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                                      a=a, b=b))

    def update(self) -> None:
        for group in self.param_groups:
            lr, wd, a, b = group["lr"], group["weight_decay"], group["a"], group["b"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamATan2 does not support sparse gradients")
                grad = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)  # CPU scalar, like torch.optim.Adam
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"].item()
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                if wd:
                    p.mul_(1.0 - lr * wd)
                exp_avg.lerp_(grad, 1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                den = exp_avg_sq.mul(b * b / (1.0 - beta2 ** t)).sqrt_()  # b·√v̂
                update = exp_avg.mul(1.0 / (1.0 - beta1 ** t)).atan2_(den)  # atan2(m̂, b·√v̂)
                p.add_(update, alpha=-lr * a)

