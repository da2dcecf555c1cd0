"""Restoring a snapshot, read once top-down: one entry per use, each reading the files in
the same order through the readers below it (:mod:`.manifest`, :mod:`.tensorio`, DCP in
:mod:`.sharded`), which never call back up:

- :func:`restore_snapshot`: a segment resuming. Verify the manifest (with N ranks: rank 0
  hashes, all refuse together), read the files, then load the parts: ``config`` first (an
  incompatible resume stops before any weight is touched), the weights and optimizer state
  (on N ranks a sharded snapshot's through DCP into each rank's shards), the other parts,
  the trainer state (step, data position) and the RNG streams last.
- :func:`load_snapshot`: the whole snapshot as a :class:`Snapshot` record (tests, tools);
- :func:`load_model_state` / :func:`load_weights_only`: only the weights (evaluation,
  export, a warm start).

Both kinds of snapshot (:mod:`.snapshot`, :mod:`.sharded`) are read here; a sharded one
comes back in the unsharded form unless N ranks resume it (DCP, resharded).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import flagged_ranks
from ..errors import CheckpointError
from .contents import (
    CONFIG_FILE,
    DCP_SUFFIX,
    MODEL_FILE,
    OPTIMIZER_DCP,
    OPTIMIZER_JSON,
    OPTIMIZER_TENSORS,
    RNG_JSON,
    RNG_TENSORS,
    TRAINER_STATE,
    dcp_dirs,
    rng_names,
)
from .manifest import verify_snapshot
from .sharded import flatten_optimizer_state, load_dcp, optimizer_by_index, read_dcp
from .sharded import unflatten_optimizer_state as unflatten
from .state_io import REQUIRED, Ranks, Stateful, split_tensors
from .tensorio import read_json, read_safetensors, read_tree

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    """A verified snapshot in memory, ready to hand to ``load_state_dict`` calls."""

    path: Path
    manifest: dict[str, Any]
    model_state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any]
    trainer_state: dict[str, Any]
    rng_state: dict[str, Any]
    config_yaml: str
    extra_tensors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    extra_files: dict[str, bytes] = field(default_factory=dict)
    # a sharded snapshot located for N ranks: {set name: DCP directory}; the tensors of
    # those sets are then left out (model_state and optimizer tensors empty)
    dcp: dict[str, Path] = field(default_factory=dict)


# --------------------------------------------------------------------------- a segment


def restore_snapshot(path: str | Path, states: Mapping[str, Stateful], *,
                     ranks: Ranks | None = None,
                     map_location: str | torch.device = "cpu") -> Snapshot:
    """Verify snapshot ``path`` and load it into ``states`` (collective with ``ranks``), in
    the order of the module docstring. Returns the snapshot record (manifest, extra
    files, …)."""
    path = Path(path)
    snap = _read_agreed(path, ranks, map_location)
    states["config"].load_state_dict({"yaml": snap.config_yaml})
    others = {n: p for n, p in states.items() if n not in REQUIRED}
    if snap.dcp:  # sharded snapshot, N ranks: DCP into each part's own shards
        sets = _load_sharded(snap, states, others)
    else:
        states["model"].load_state_dict(snap.model_state)
        states["optimizer"].load_state_dict(snap.optimizer_state)
        sets = snap.extra_tensors
    sections = _load_others(snap, others, sets)
    states["trainer"].load_state_dict({k: v for k, v in snap.trainer_state.items()
                                       if k not in sections})
    states["rng"].load_state_dict(snap.rng_state)
    return snap


def _read_agreed(path: Path, ranks: Ranks | None, map_location: str | torch.device) -> Snapshot:
    """:func:`load_snapshot`; with N ranks rank 0 hashes every file, the others check sizes
    only, sharded sets are only located, and all ranks refuse together."""
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


def _load_sharded(snap: Snapshot, states: Mapping[str, Stateful],
                  others: Mapping[str, Stateful]) -> dict[str, dict[str, torch.Tensor]]:
    """N ranks, sharded snapshot: model and optimizer loaded through DCP into their own
    shards (resharded); the other parts' DCP sets read into templates of their shards."""
    model = states["model"].state_dict()
    load_dcp(model, snap.dcp["model"])
    states["model"].load_state_dict(model)
    doc = snap.optimizer_state  # names, not tensors
    flat, _ = flatten_optimizer_state(states["optimizer"].state_dict()["state"])
    load_dcp(flat, snap.dcp["optimizer"])
    states["optimizer"].load_state_dict({"state": unflatten(flat, doc.get("state_other") or {}),
                                         "param_groups": doc["param_groups"]})
    sets = {}
    for name, part in others.items():
        if name in snap.dcp:
            sets[name], _ = split_tensors(part.state_dict())
            load_dcp(sets[name], snap.dcp[name])
    return sets


def _load_others(snap: Snapshot, others: Mapping[str, Stateful],
                 sets: Mapping[str, dict[str, torch.Tensor]]) -> set[str]:
    """Every other part from its tensor set and/or its section of trainer_state.json;
    returns the section names (not the trainer's own keys)."""
    sections = set()
    for name, part in others.items():
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
    for name in sorted(set(snap.dcp or sets) - set(others) - set(REQUIRED)):
        log.info("%s holds '%s' tensors, which this run does not carry on", snap.path, name)
        sections.add(name)
    return sections


# --------------------------------------------------------------------------- the whole record


def load_snapshot(path: str | Path, *, map_location: str | torch.device = "cpu", rank: int = 0,
                  consolidate: bool = True, hash_files: list[str] | None = None) -> Snapshot:
    """Verify ``path`` against its manifest (every sha256 unless ``hash_files`` narrows it)
    and load all of it, in the form ``state_dict()`` gave (int keys, tuples, tensors).

    A sharded snapshot comes back as an unsharded one (full tensors, optimizer state by
    parameter index) with ``rank``'s RNG state, or with ``consolidate=False`` only located
    (``Snapshot.dcp``). Model and extra tensors go to ``map_location``; optimizer and RNG
    tensors stay on the CPU (``optimizer.load_state_dict`` moves moments to their parameters).
    """
    path = Path(path)
    manifest = verify_snapshot(path, hash_files=hash_files)
    files = manifest["files"]
    sets = {name: path / d for name, d in dcp_dirs(manifest).items()}
    snap = Snapshot(path=path, manifest=manifest, model_state={}, optimizer_state={},
                    trainer_state=read_json(path / TRAINER_STATE),
                    rng_state=read_tree(path, *_rng_files(path, files, rank, bool(sets))),
                    config_yaml=(path / CONFIG_FILE).read_text(),
                    extra_files={name: (path / name).read_bytes()
                                 for name, r in files.items() if r.get("role") == "extra_file"})
    if not sets:
        snap.model_state, _ = read_safetensors(path / MODEL_FILE, device=map_location)
        snap.optimizer_state = read_tree(path, OPTIMIZER_JSON, OPTIMIZER_TENSORS)
        snap.extra_tensors = {name.removesuffix(".safetensors"): read_safetensors(
            path / name, device=map_location)[0]
            for name, r in files.items() if r.get("role") == "extra_tensors"}
        return snap
    if "optimizer" not in sets:
        raise CheckpointError(f"sharded snapshot {path} has no {OPTIMIZER_DCP}/; it is "
                              "incomplete, resume from another one")
    snap.optimizer_state = read_tree(path, OPTIMIZER_JSON)  # parameter names, DCP tensors
    if not consolidate:
        snap.dcp = sets
        return snap
    snap.model_state = read_dcp(sets["model"], device=map_location)
    snap.optimizer_state = optimizer_by_index(snap.optimizer_state, read_dcp(sets["optimizer"]),
                                              str(path / OPTIMIZER_JSON))
    snap.extra_tensors = {name: read_dcp(d, device=map_location) for name, d in sets.items()
                          if name not in ("model", "optimizer")}
    return snap


def _rng_files(path: Path, files: Mapping[str, Any], rank: int, sharded: bool
               ) -> tuple[str, str]:
    """(JSON, tensors) names of the RNG state to restore: ``rng.*``, or in a sharded
    snapshot rank ``rank``'s (rank 0's for a rank the writing run did not have, logged)."""
    if not sharded:
        return RNG_JSON, RNG_TENSORS
    if rng_names(rank)[0] not in files:
        log.info("%s has no RNG state for rank %d (written by fewer ranks): using rank 0's",
                 path, rank)
        rank = 0
    tensors, doc = rng_names(rank)
    if tensors not in files:
        raise CheckpointError(f"sharded snapshot {path} has no {tensors}; it is incomplete, "
                              "resume from another one")
    return doc, tensors


# --------------------------------------------------------------------------- weights only


def load_model_state(path: str | Path, *, which: str = "model",
                     map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Only the weights: ``which="model"`` or the name of an extra tensor set (``"ema"``).

    Checks the whole manifest (presence and sizes) but hashes only the file(s) it reads, so
    evaluation does not pay for reading optimizer state. A sharded snapshot's DCP set is
    consolidated into full tensors without a process group.
    """
    path = Path(path)
    fname = MODEL_FILE if which == "model" else f"{which}.safetensors"
    manifest = verify_snapshot(path, hash_files=[fname, f"{which}{DCP_SUFFIX}/"])
    sets = dcp_dirs(manifest)
    if which in sets:  # sharded: that set's files hashed, now consolidated
        return read_dcp(path / sets[which], device=map_location)
    if fname not in manifest["files"]:
        have = sorted({n.removesuffix(".safetensors") for n, r in manifest["files"].items()
                       if r.get("role") == "extra_tensors"} | (set(sets) - {"model", "optimizer"}))
        fix = ("leave out --use-ema (use_ema=true in model_args) to use its trained weights, "
               "or keep an EMA when training (train.ema_decay, e.g. 0.999)" if which == "ema"
               else "use its trained weights")
        raise CheckpointError(f"snapshot {path} has no '{which}' weights (extra tensor sets: "
                              f"{have or 'none'}): it was trained without them; {fix}")
    tensors, _ = read_safetensors(path / fname, device=map_location)
    return tensors


def load_weights_only(snapshot_dir: str | Path, model: Any, *, which: str = "model",
                      strict: bool = True) -> dict[str, Any]:
    """Warm start: copy a snapshot's weights into ``model`` and nothing else.

    Use this deliberately when the config changed in a resume-relevant key (see
    :mod:`.compat`); optimizer state, spike-guard baselines, RNG streams and the data
    cursor are NOT restored and start fresh. ``which`` may name an extra tensor set
    (``"ema"``). With ``strict``, missing, unexpected or differently shaped keys raise
    CheckpointError listing them. Returns ``{"warm_start_from": path, "step": …}`` for the
    trainer state and logs.
    """
    snapshot_dir = Path(snapshot_dir)
    state = load_model_state(snapshot_dir, which=which)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    problems = ([f"missing {k}" for k in missing] + [f"unexpected {k}" for k in unexpected]
                + [f"{k} shape {tuple(state[k].shape)} vs model {tuple(own[k].shape)}"
                   for k in shapes])
    if shapes or (strict and problems):
        shown = "; ".join(problems[:12]) + (f"; … {len(problems) - 12} more" if len(problems) > 12
                                             else "")
        raise CheckpointError(f"warm start from {snapshot_dir}: weights do not fit the model "
                              f"({shown}); match the model config to the snapshot's")
    if any(type(t).__name__ == "DTensor" for t in own.values()):
        # an FSDP-sharded model: every rank cuts its own shards out of the full tensors
        from torch.distributed.checkpoint.state_dict import (  # lazy: only sharded models need it
            StateDictOptions,
            set_model_state_dict,
        )

        set_model_state_dict(model, state,
                             options=StateDictOptions(full_state_dict=True, strict=strict))
    else:
        model.load_state_dict(state, strict=strict)
    try:
        step = read_json(snapshot_dir / TRAINER_STATE).get("step")
    except CheckpointError:
        step = None
    return {"warm_start_from": str(snapshot_dir), "step": step, "weights": which}


__all__ = ["Snapshot", "load_model_state", "load_snapshot", "load_weights_only",
           "restore_snapshot"]
