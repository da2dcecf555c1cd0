"""The one checkpoint path: :func:`save` a mapping of stateful parts (:func:`.restore.restore_snapshot`
reads it back).

A training state is a mapping ``{name: part}`` whose parts have torch's ``Stateful`` shape
(``state_dict()`` / ``load_state_dict()``). This module decides where each part goes, from
its name and from what its state holds, for one process and for N ranks alike; it knows
nothing of what the parts are (the trainer builds the mapping, see
:mod:`pipeline_lib.train.states`).

==================  ================================  ====================================
part                one process                       N ranks (FSDP2-sharded)
==================  ================================  ====================================
``config``          ``config.yaml`` (``{"yaml": …}``)  the same, from rank 0
``model``           ``model.safetensors``             ``model_dcp/``
``optimizer``       ``optimizer.safetensors`` +       ``optimizer_dcp/`` + ``optimizer.json``
                    ``optimizer.json`` (torch's
                    ``optimizer.state_dict()`` shape)
``rng``             ``rng.safetensors`` + ``.json``   ``rng_rank{r}.*`` (every rank its own)
``trainer``         ``trainer_state.json`` (top)      the same, from rank 0
other, tensors      ``{name}.safetensors``            ``{name}_dcp/``
other, plain JSON   ``trainer_state.json[name]``      the same, from rank 0
==================  ================================  ====================================

Restoring hands every part the form it saved, except across a change of world size: an
unsharded snapshot gives sharded parts full tensors (each part cuts its own shards), and a
sharded one read by one process is consolidated (the optimizer back to parameter indices).
A sharded snapshot resumed on N ranks is read through DCP into the parts' own shards
(resharded to this world size). A part with ``optional = True`` may be absent from the
snapshot (a warning); any other absent part refuses the snapshot. The writers underneath
are :mod:`.snapshot` (one process) and :mod:`.sharded` (N ranks); the reader is
:mod:`.restore`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ..errors import CheckpointError
from .sharded import flatten_optimizer_state, write_sharded_snapshot
from .snapshot import write_snapshot

REQUIRED = ("config", "model", "optimizer", "rng", "trainer")


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Ranks:
    """This process's place among N ranks writing or reading one sharded snapshot."""

    rank: int
    world_size: int
    device: torch.device


def split_tensors(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A part's entries split into (tensors, everything else)."""
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in state.items() if k not in tensors}


def _split(states: Mapping[str, Stateful]) -> tuple[dict[str, Any], dict[str, Any],
                                                     dict[str, Any]]:
    """(required parts' states, other parts' tensor sets, trainer_state.json document)."""
    missing = [n for n in REQUIRED if n not in states]
    if missing:
        raise CheckpointError(f"a snapshot needs the parts {list(REQUIRED)}; {missing} were "
                              "not given (a bug in the caller)")
    core = {n: states[n].state_dict() for n in REQUIRED}
    tensor_sets: dict[str, Any] = {}
    trainer_doc = dict(core["trainer"])
    for name, part in states.items():
        if name in REQUIRED:
            continue
        tensors, rest = split_tensors(part.state_dict())
        if name in trainer_doc:
            raise CheckpointError(f"part '{name}' collides with the trainer state's key of "
                                  "that name; rename the part")
        if tensors:
            tensor_sets[name] = tensors
        if rest or not tensors:
            trainer_doc[name] = rest
    return core, tensor_sets, trainer_doc


def save(out: str | Path, states: Mapping[str, Stateful], *,
         files: Mapping[str, bytes | str] | None = None, ranks: Ranks | None = None) -> Path:
    """Write ``states`` (and extra ``files``) as the snapshot ``out``, atomically.

    With ``ranks`` every rank calls it (collective) with its own shards and RNG streams.
    """
    core, tensor_sets, trainer_doc = _split(states)
    config_yaml = str(core["config"]["yaml"])
    if ranks is None:
        return write_snapshot(out, model_state=core["model"], optimizer_state=core["optimizer"],
                              trainer_state=trainer_doc, rng_state=core["rng"],
                              config_yaml=config_yaml, extra_tensors=tensor_sets,
                              extra_files=files)
    osd = core["optimizer"]
    tensors, other = flatten_optimizer_state(osd["state"])
    trainer_doc["world_size"] = ranks.world_size
    return write_sharded_snapshot(
        out, rank=ranks.rank, device=ranks.device, model_state=core["model"],
        optimizer_tensors=tensors,
        optimizer_doc={"param_groups": osd["param_groups"], "state_other": other},
        trainer_state=trainer_doc, rng_state=core["rng"], config_yaml=config_yaml,
        extra_sharded=tensor_sets, extra_files=files)


__all__ = ["REQUIRED", "Ranks", "Stateful", "save", "split_tensors"]
