"""The one checkpoint path: :func:`save` and :func:`load` a mapping of stateful parts.

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

Loading hands every part the form it saved, except across a change of world size: an
unsharded snapshot gives sharded parts full tensors (each part cuts its own shards), and a
sharded one read by one process is consolidated (the optimizer back to parameter indices).
A sharded snapshot resumed on N ranks is read through DCP into the parts' own shards
(resharded to this world size). A part with ``optional = True`` may be absent from the
snapshot (a warning); any other absent part refuses the snapshot. The writers and readers
underneath are :mod:`.snapshot` (one process) and :mod:`.sharded` (N ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ..device import flagged_ranks
from ..errors import CheckpointError
from .contents import Snapshot
from .sharded import (
    flatten_optimizer_state,
    load_dcp,
    unflatten_optimizer_state,
    write_sharded_snapshot,
)
from .snapshot import load_snapshot, write_snapshot

log = logging.getLogger(__name__)

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


def _parts(state: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
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
    for name, part in _others(states).items():
        tensors, rest = _parts(part.state_dict())
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


def read_agreed(path: Path, ranks: Ranks | None, map_location: str | torch.device) -> Snapshot:
    """:func:`~.snapshot.load_snapshot`; with N ranks rank 0 hashes every file, the others
    check sizes only, sharded sets are only located, and all ranks refuse together."""
    if ranks is None:
        return load_snapshot(path, map_location=map_location)
    error: CheckpointError | None = None
    try:
        snap = load_snapshot(path, map_location=map_location, rank=ranks.rank,
                             consolidate=False, hash_files=None if ranks.rank == 0 else [])
    except CheckpointError as exc:
        error = exc
    if flagged_ranks(error is not None, ranks.device):
        raise error or CheckpointError(f"snapshot {path} was refused on another rank (see "
                                       "rank 0's error); resume from another snapshot")
    return snap


def load(path: str | Path, states: Mapping[str, Stateful], *, ranks: Ranks | None = None,
         map_location: str | torch.device = "cpu") -> Snapshot:
    """Verify snapshot ``path`` and load it into ``states`` (collective with ``ranks``).

    Order: ``config`` first (a part that refuses an incompatible resume stops it before any
    weight is touched), then the tensors, the JSON parts, ``trainer``, and ``rng`` last.
    Returns the snapshot record (its manifest, extra files, …).
    """
    path = Path(path)
    snap = read_agreed(path, ranks, map_location)
    states["config"].load_state_dict({"yaml": snap.config_yaml})
    if snap.dcp:  # sharded snapshot, N ranks: DCP into each part's own shards
        sets = _sharded_sets(snap, states)
        stored = set(snap.dcp) - set(REQUIRED)
    else:
        states["model"].load_state_dict(snap.model_state)
        states["optimizer"].load_state_dict(snap.optimizer_state)
        sets, stored = snap.extra_tensors, set(snap.extra_tensors)
    sections = _load_others(snap, states, sets, stored)
    states["trainer"].load_state_dict({k: v for k, v in snap.trainer_state.items()
                                       if k not in sections})
    states["rng"].load_state_dict(snap.rng_state)
    return snap


def _others(states: Mapping[str, Stateful]) -> dict[str, Stateful]:
    return {n: p for n, p in states.items() if n not in REQUIRED}


def _load_others(snap: Snapshot, states: Mapping[str, Stateful],
                 sets: Mapping[str, dict[str, torch.Tensor]], stored: set[str]) -> set[str]:
    """Every other part from its tensor set and/or its section of trainer_state.json;
    returns the section names (not the trainer's own keys)."""
    sections = set()
    for name, part in _others(states).items():
        section = snap.trainer_state.get(name)
        if name not in sets and not isinstance(section, Mapping):
            if not getattr(part, "optional", False):
                raise CheckpointError(f"snapshot {snap.path} holds no '{name}' state; it was "
                                      "written without it: resume with the config that wrote "
                                      "it, or warm-start the weights")
            log.warning("%s holds no '%s' state: it starts fresh", snap.path, name)
            continue
        if isinstance(section, Mapping):
            sections.add(name)
        part.load_state_dict({**(section or {}), **sets.get(name, {})})
    for name in sorted(stored - set(states)):
        log.info("%s holds '%s' tensors, which this run does not carry on", snap.path, name)
        sections.add(name)
    return sections


def _sharded_sets(snap: Snapshot, states: Mapping[str, Stateful]
                  ) -> dict[str, dict[str, torch.Tensor]]:
    """N ranks, sharded snapshot: model and optimizer loaded through DCP into their own
    shards (resharded); the other parts' DCP sets read into templates of their shards."""
    model = states["model"].state_dict()
    load_dcp(model, snap.dcp["model"])
    states["model"].load_state_dict(model)
    doc = snap.optimizer_state  # names, not tensors
    flat, _ = flatten_optimizer_state(states["optimizer"].state_dict()["state"])
    load_dcp(flat, snap.dcp["optimizer"])
    states["optimizer"].load_state_dict({
        "state": unflatten_optimizer_state(flat, doc.get("state_other") or {}),
        "param_groups": doc["param_groups"]})
    sets = {}
    for name, part in _others(states).items():
        if name in snap.dcp:
            template, _ = _parts(part.state_dict())
            load_dcp(template, snap.dcp[name])
            sets[name] = template
    return sets


__all__ = ["Ranks", "Stateful", "load", "read_agreed", "save"]
