"""A segment's stateful parts in torch's ``Stateful`` shape, for the one checkpoint path.

:func:`segment_parts` gives the mapping the trainer hands to
:func:`pipeline_lib.checkpoint.state_io.save` and
:func:`~pipeline_lib.checkpoint.restore.restore_snapshot`. Parts that already have the shape
go in as they are (spike guard, loop sampler, RNG streams, trainer counters); the adapters
here give it to the rest:

- :class:`ConfigPart`: the resolved config; loading it refuses a config that changed in a
  key exact resume depends on (before any weight is touched).
- :class:`ModelPart` / :class:`OptimizerPart`: plain or FSDP2-sharded; a sharded part
  takes full tensors too (an unsharded snapshot cut into this run's shards).
- :class:`EMAPart`: the EMA's averaged weights plus its decay and update count (optional:
  a snapshot written without an EMA starts one from the restored weights).
- :class:`MoEBiases`: a readable copy of the MoE balance biases (the buffers themselves
  are model weights); loading checks that the copy and the weights agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..checkpoint.compat import check_resume_compatible, config_from_yaml
from ..errors import CheckpointError
from ..spec.config import Config
from ..spec.config_write import config_yaml
from .distributed import is_dtensor
from .ema import WeightsEMA
from .optim import load_optimizer_state, refresh_group_hparams


class ConfigPart:
    """The resolved config (``config.yaml``); a resume must keep the exactness keys."""

    def __init__(self, cfg: Config, source: Path | None = None, *, text: str | None = None):
        self.cfg, self.source = cfg, source
        self.text = text  # the YAML of ``cfg`` when the caller has it (dumping takes ~15 ms)

    def state_dict(self) -> dict[str, Any]:
        return {"yaml": self.text if self.text is not None else config_yaml(self.cfg)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        where = f"{self.source}/config.yaml" if self.source else "config.yaml"
        check_resume_compatible(config_from_yaml(state["yaml"], where), self.cfg,
                                source=self.source or "the snapshot")


class ModelPart:
    """The model's weights; with ``sharded`` its FSDP2 shards (full tensors load too)."""

    def __init__(self, model: nn.Module, *, sharded: bool, source: Path | None = None):
        self.model, self.sharded, self.source = model, sharded, source

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            return self.model.state_dict()
        # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.sharded:
            self._load_sharded(state)
            return
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"the weights of {self.source} do not fit the model (missing "
                                  f"{missing[:6]}, unexpected {unexpected[:6]}); resume with the "
                                  "snapshot's model config")

    def _load_sharded(self, state: dict[str, Any]) -> None:
        # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        full = not any(is_dtensor(v) for v in state.values())
        try:
            set_model_state_dict(self.model, state,
                                 options=StateDictOptions(full_state_dict=full))
        except (RuntimeError, KeyError) as exc:
            raise CheckpointError(f"the weights of {self.source} do not fit the model "
                                  f"({str(exc).splitlines()[0]}); resume with the snapshot's "
                                  "model config") from None


class OptimizerPart:
    """The optimizer: by parameter index in one process, by parameter name when sharded
    (an index-keyed state of an unsharded snapshot loads into the sharded one too)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: Config, *,
                 sharded: bool, source: Path | None = None):
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.sharded, self.source = sharded, source

    def state_dict(self) -> dict[str, Any]:
        if not self.sharded:
            return self.optimizer.state_dict()
        # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        where = str(self.source / "optimizer.safetensors") if self.source else "the snapshot"
        if not self.sharded:
            load_optimizer_state(self.optimizer, state, self.cfg.train, source=where)
            return
        # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        saved = [g.get("name") for g in state["param_groups"]]
        built = [g.get("name") for g in self.optimizer.param_groups]
        if saved != built:
            raise CheckpointError(f"optimizer state in {where} has parameter groups {saved}, "
                                  f"the model gives {built}; the model changed: warm-start "
                                  "weights only")
        by_index = all(isinstance(p, int) for g in state["param_groups"] for p in g["params"])
        if by_index:
            state = self._by_name(state, where)
        set_optimizer_state_dict(self.model, self.optimizer, state,
                                 options=StateDictOptions(full_state_dict=by_index))
        refresh_group_hparams(self.optimizer, self.cfg.train)

    def _by_name(self, state: dict[str, Any], where: str) -> dict[str, Any]:
        """An ``optimizer.state_dict()`` (parameters by index) keyed by parameter name."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        order = [names[id(p)] for g in self.optimizer.param_groups for p in g["params"]]
        try:
            return {"state": {order[i]: s for i, s in state["state"].items()},
                    "param_groups": [{**g, "params": [order[i] for i in g["params"]]}
                                     for g in state["param_groups"]]}
        except (IndexError, KeyError, TypeError) as exc:
            raise CheckpointError(f"optimizer state in {where} does not fit this model "
                                  f"({exc!r}); resume with the snapshot's config") from None


class EMAPart:
    """The EMA's weights (``ema.safetensors``) and its progress (``trainer_state["ema"]``)."""

    optional = True  # a snapshot without an EMA: it starts from the restored weights

    def __init__(self, ema: WeightsEMA):
        self.ema, self.loaded = ema, False

    def state_dict(self) -> dict[str, Any]:
        return {**self.ema.state_dict(), "decay": self.ema.decay,
                "updates": self.ema.num_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        like = self.ema.state_dict()
        tensors = {k: _distribute_like(v, like.get(k)) for k, v in state.items()
                   if isinstance(v, torch.Tensor)}
        self.ema.load_state_dict(tensors)
        self.ema.num_updates = int(state.get("updates", 0))
        self.loaded = True


class MoEBiases:
    """A readable copy of every MoE layer's balance bias (``trainer_state["moe_biases"]``)."""

    def __init__(self, model: nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return {name: [float(b) for b in layer.balance_bias]
                for name, layer in self.model.moe_layers()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, values in self.state_dict().items():  # the weights are loaded by now
            if name in state and state[name] != values:
                raise CheckpointError(f"trainer_state.json moe_biases['{name}'] disagrees with "
                                      "the snapshot's weights; the snapshot is inconsistent, "
                                      "resume from another one")


def _distribute_like(tensor: torch.Tensor, target: Any) -> torch.Tensor:
    """A full tensor cut into ``target``'s shards when ``target`` is a DTensor."""
    if not is_dtensor(target) or is_dtensor(tensor):
        return tensor
    # torch.distributed (FSDP, DTensor, DCP: ~0.6 s): only multi-process segments load it
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(tensor.to(target.device, target.dtype), target.device_mesh,
                             target.placements)


__all__ = ["ConfigPart", "EMAPart", "MoEBiases", "ModelPart", "OptimizerPart"]
