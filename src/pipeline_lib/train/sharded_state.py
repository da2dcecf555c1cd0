"""Training state of an FSDP2-sharded model ↔ snapshots (sharded or not).

``torch.distributed.checkpoint.state_dict`` translates between the live sharded objects
and state dicts keyed by parameter name (FQN): :func:`sharded_parts` gathers what
:func:`~pipeline_lib.checkpoint.sharded.write_sharded_snapshot` needs (each rank's shards);
:func:`load_sharded_into` loads DCP sets resharded to this run's world size;
:func:`load_full_into` loads an unsharded snapshot (written by one process) into the
sharded model, so a run can move from 1 process to N and back.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..checkpoint.contents import Snapshot
from ..checkpoint.sharded import (
    flatten_optimizer_state,
    load_dcp,
    unflatten_optimizer_state,
)
from ..errors import CheckpointError
from .ema import WeightsEMA

log = logging.getLogger(__name__)


def _check_groups(saved: list[dict[str, Any]], optimizer: torch.optim.Optimizer,
                  source: str) -> None:
    names = [g.get("name") for g in saved]
    built = [g.get("name") for g in optimizer.param_groups]
    if names != built:
        raise CheckpointError(f"optimizer state in {source} has parameter groups {names}, the "
                              f"model gives {built}; the model changed: warm-start weights only")


def sharded_parts(model: nn.Module, optimizer: torch.optim.Optimizer,
                  ema: WeightsEMA | None) -> dict[str, Any]:
    """This rank's shards: keyword arguments of ``write_sharded_snapshot`` (tensors part)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    osd = get_optimizer_state_dict(model, optimizer)
    tensors, other = flatten_optimizer_state(osd["state"])
    return {
        "model_state": get_model_state_dict(model),
        "optimizer_tensors": tensors,
        "optimizer_doc": {"param_groups": osd["param_groups"], "state_other": other},
        "extra_sharded": {"ema": ema.state_dict()} if ema is not None else None,
    }


def load_sharded_into(snap: Snapshot, model: nn.Module, optimizer: torch.optim.Optimizer,
                      ema: WeightsEMA | None) -> None:
    """Collective: a sharded snapshot's DCP sets into this run's shards (any world size)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    doc = snap.optimizer_state  # names, not tensors (consolidate=False)
    _check_groups(doc["param_groups"], optimizer, str(snap.path / "optimizer.json"))
    model_sd = get_model_state_dict(model)
    load_dcp(model_sd, snap.dcp["model"])
    set_model_state_dict(model, model_sd)
    # templates: the optimizer's own state, initialised by a zero-lr step if still empty
    osd = get_optimizer_state_dict(model, optimizer)
    flat, _ = flatten_optimizer_state(osd["state"])
    load_dcp(flat, snap.dcp["optimizer"])
    state = unflatten_optimizer_state(flat, doc.get("state_other") or {})
    set_optimizer_state_dict(model, optimizer, {"state": state,
                                                "param_groups": doc["param_groups"]})
    _load_ema(snap, ema, sharded=True)


def load_full_into(snap: Snapshot, model: nn.Module, optimizer: torch.optim.Optimizer,
                   ema: WeightsEMA | None) -> None:
    """An unsharded snapshot (full tensors, optimizer by index) into the sharded model."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    try:
        set_model_state_dict(model, snap.model_state, options=full)
    except (RuntimeError, KeyError) as exc:
        raise CheckpointError(f"the weights of {snap.path} do not fit the model "
                              f"({str(exc).splitlines()[0]}); resume with the snapshot's "
                              "model config") from None
    saved = snap.optimizer_state
    _check_groups(saved["param_groups"], optimizer, str(snap.path / "optimizer.json"))
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in optimizer.param_groups for p in g["params"]]
    try:
        by_name = {"state": {order[i]: s for i, s in saved["state"].items()},
                   "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                                    for g in saved["param_groups"]]}
    except (IndexError, KeyError, TypeError) as exc:
        raise CheckpointError(f"optimizer state in {snap.path} does not fit this model "
                              f"({exc!r}); resume with the snapshot's config") from None
    set_optimizer_state_dict(model, optimizer, by_name, options=full)
    _load_ema(snap, ema, sharded=False)


def _load_ema(snap: Snapshot, ema: WeightsEMA | None, *, sharded: bool) -> None:
    if ema is None:
        return
    if sharded and "ema" in snap.dcp:
        state = ema.state_dict()
        load_dcp(state, snap.dcp["ema"])  # in place into the shadow shards
    elif not sharded and "ema" in snap.extra_tensors:
        ema.load_state_dict(_distribute_like(snap.extra_tensors["ema"], ema.state_dict()))
    else:
        log.warning("train.ema_decay is on but %s has no EMA weights: the EMA starts from "
                    "the restored weights", snap.path)
        return
    ema.num_updates = int((snap.trainer_state.get("ema") or {}).get("updates", 0))


def _distribute_like(full: dict[str, torch.Tensor], like: dict[str, torch.Tensor]
                     ) -> dict[str, torch.Tensor]:
    """Full tensors cut into the shards of ``like``'s DTensors (others kept whole)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    out = {}
    for key, tensor in full.items():
        target = like.get(key)
        if isinstance(target, DTensor):
            tensor = distribute_tensor(tensor.to(target.device, target.dtype),
                                       target.device_mesh, target.placements)
        out[key] = tensor
    return out
