"""Snapshot mechanics: write a whole training state atomically, verify it, load it back.

Layout of a snapshot directory (every file listed in MANIFEST.json, which is written last):

=========================  ==============================================================
``model.safetensors``      model ``state_dict`` (tied tensors stored once, restored tied)
``optimizer.safetensors``  every tensor of ``optimizer.state_dict()`` (moments, steps)
``optimizer.json``         the rest of it (param_groups, hyper-parameters) as tagged JSON
``rng.safetensors``        RNG tensors (torch CPU / CUDA generator states)
``rng.json``               python/numpy RNG states and references into rng.safetensors
``trainer_state.json``     step, tokens, cursor, guard state, … (plain JSON from the trainer)
``config.yaml``            the resolved config the segment ran with
``{name}.safetensors``     extra tensor sets, e.g. ``ema.safetensors``
other names                extra files, e.g. ``metrics.jsonl``, ``samples.jsonl``
``MANIFEST.json``          sha256, size and role of each file above
=========================  ==============================================================

A multi-process run writes a *sharded* snapshot instead (:mod:`.sharded`): DCP directories
``model_dcp/``, ``optimizer_dcp/`` (and ``ema_dcp/``) in place of the model, optimizer and
extra safetensors files, and ``rng_rank{r}.*`` per rank in place of ``rng.*``.
:func:`load_snapshot` and :func:`load_model_state` read both kinds. The file names, the
:class:`Snapshot` record and the checks both writers share live in :mod:`.contents`.

Everything is written into a hidden temporary sibling (each file fsynced, then the
directory), then renamed onto the final name; see :mod:`.fsutil`. Loading verifies the
manifest first. Tensors live only in safetensors, everything else in JSON: no pickle.
After the weights, the optimizer state, the config and each extra file, the writer calls
:func:`.write_hooks.file_written`: a seam where fault tests pause it to SIGKILL it
mid-write (production installs no hook).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from .contents import (
    CONFIG_FILE,
    MODEL_FILE,
    OPTIMIZER_JSON,
    OPTIMIZER_TENSORS,
    RNG_JSON,
    RNG_TENSORS,
    TRAINER_STATE,
    Snapshot,
    check_snapshot_contents,
    dcp_dirs,
    is_sharded,
    prepare_snapshot_tmp,
    read_json,
)
from .manifest import (
    read_manifest,
    staged_snapshot,
    verify_snapshot,
    write_bytes_file,
)
from .sharded import load_sharded_snapshot, read_dcp
from .tensorio import dumps_json, join_tree, read_safetensors, split_tree, write_safetensors
from .write_hooks import file_written

log = logging.getLogger(__name__)

__all__ = ["Snapshot", "load_model_state", "load_snapshot", "load_weights_only",
           "write_snapshot"]


def write_snapshot(
    out_dir: str | Path,
    *,
    model_state: Mapping[str, torch.Tensor],
    optimizer_state: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    rng_state: Mapping[str, Any],
    config_yaml: str,
    extra_tensors: Mapping[str, Mapping[str, torch.Tensor]] | None = None,
    extra_files: Mapping[str, bytes | str] | None = None,
) -> Path:
    """Write a complete snapshot to ``out_dir`` atomically and return ``out_dir``.

    ``optimizer_state`` is ``optimizer.state_dict()``; ``rng_state`` comes from
    :func:`~.rng.capture_rng_state` (or nests several, e.g. per rank); ``trainer_state``
    must be plain JSON. An existing ``out_dir`` is replaced only when it is itself a valid
    snapshot (atomic swap); anything else there raises CheckpointError. Leftover temporary
    siblings of earlier, killed writes are removed first.
    """
    out_dir = Path(out_dir)
    extra_tensors = dict(extra_tensors or {})
    extra_files = dict(extra_files or {})
    check_snapshot_contents(trainer_state, [f"{k}.safetensors" for k in extra_tensors],
                            extra_files)
    opt_doc, opt_tensors = split_tree(dict(optimizer_state), OPTIMIZER_JSON)
    rng_doc, rng_tensors = split_tree(dict(rng_state), RNG_JSON)
    tmp = prepare_snapshot_tmp(out_dir)
    started = time.perf_counter()
    with staged_snapshot(tmp, out_dir, f"write snapshot {out_dir}") as records:
        records[MODEL_FILE] = write_safetensors(tmp / MODEL_FILE, model_state, role="model")
        file_written(tmp / MODEL_FILE)
        records[OPTIMIZER_TENSORS] = write_safetensors(tmp / OPTIMIZER_TENSORS, opt_tensors,
                                                       role="optimizer_tensors")
        records[OPTIMIZER_JSON] = write_bytes_file(tmp / OPTIMIZER_JSON, dumps_json(opt_doc),
                                                   "optimizer_json")
        file_written(tmp / OPTIMIZER_JSON)
        records[RNG_TENSORS] = write_safetensors(tmp / RNG_TENSORS, rng_tensors, role="rng_tensors")
        records[RNG_JSON] = write_bytes_file(tmp / RNG_JSON, dumps_json(rng_doc), "rng_json")
        records[TRAINER_STATE] = write_bytes_file(
            tmp / TRAINER_STATE, dumps_json(trainer_state), "trainer_state")
        records[CONFIG_FILE] = write_bytes_file(tmp / CONFIG_FILE, config_yaml.encode(), "config")
        file_written(tmp / CONFIG_FILE)
        for name, tensors in sorted(extra_tensors.items()):
            fname = f"{name}.safetensors"
            records[fname] = write_safetensors(tmp / fname, tensors, role="extra_tensors")
            file_written(tmp / fname)
        for name, data in sorted(extra_files.items()):
            blob = data.encode() if isinstance(data, str) else bytes(data)
            records[name] = write_bytes_file(tmp / name, blob, "extra_file")
            file_written(tmp / name)
    total = sum(r["size"] for r in records.values())
    log.info("wrote snapshot %s (%.1f MB in %.2f s)", out_dir, total / 1e6,
             time.perf_counter() - started)
    return out_dir


def load_snapshot(path: str | Path, *, map_location: str | torch.device = "cpu", rank: int = 0,
                  consolidate: bool = True, hash_files: list[str] | None = None) -> Snapshot:
    """Verify ``path`` against its manifest (every sha256 unless ``hash_files`` narrows it)
    and load all of it.

    A sharded snapshot comes back in the same form as an unsharded one (full tensors,
    optimizer state by parameter index) with ``rank``'s RNG state; with
    ``consolidate=False`` its DCP sets are only located (``Snapshot.dcp``), for a
    multi-process resume that loads them resharded.

    Model and extra tensors go to ``map_location``; optimizer and RNG tensors stay on the
    CPU (``optimizer.load_state_dict`` moves moments next to their parameters and keeps
    ``step`` counters where torch expects them). ``optimizer_state`` has exactly the form
    ``optimizer.state_dict()`` had: int keys, tuples and tensors included.
    """
    path = Path(path)
    manifest = verify_snapshot(path, hash_files=hash_files)
    if is_sharded(manifest):
        return load_sharded_snapshot(path, manifest, rank=rank, consolidate=consolidate,
                                     map_location=map_location)
    model_state, _ = read_safetensors(path / MODEL_FILE, device=map_location)
    opt_tensors, _ = read_safetensors(path / OPTIMIZER_TENSORS)
    optimizer_state = join_tree(read_json(path / OPTIMIZER_JSON), opt_tensors,
                                str(path / OPTIMIZER_JSON))
    rng_tensors, _ = read_safetensors(path / RNG_TENSORS)
    rng_state = join_tree(read_json(path / RNG_JSON), rng_tensors, str(path / RNG_JSON))
    extra_tensors: dict[str, dict[str, torch.Tensor]] = {}
    extra_files: dict[str, bytes] = {}
    for name, record in manifest["files"].items():
        if record.get("role") == "extra_tensors":
            extra_tensors[name.removesuffix(".safetensors")], _ = read_safetensors(
                path / name, device=map_location)
        elif record.get("role") == "extra_file":
            extra_files[name] = (path / name).read_bytes()
    return Snapshot(
        path=path,
        manifest=manifest,
        model_state=model_state,
        optimizer_state=optimizer_state,
        trainer_state=read_json(path / TRAINER_STATE),
        rng_state=rng_state,
        config_yaml=(path / CONFIG_FILE).read_text(),
        extra_tensors=extra_tensors,
        extra_files=extra_files,
    )


def load_model_state(path: str | Path, *, which: str = "model",
                     map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Only the weights: ``which="model"`` or the name of an extra tensor set (``"ema"``).

    Checks the whole manifest (presence and sizes) but hashes only the file(s) it reads, so
    evaluation does not pay for reading optimizer state. A sharded snapshot's DCP set is
    consolidated into full tensors without a process group.
    """
    path = Path(path)
    fname = MODEL_FILE if which == "model" else f"{which}.safetensors"
    sets = dcp_dirs(read_manifest(path))
    if which in sets:  # sharded: hash that set's files, then consolidate them
        manifest = verify_snapshot(path, hash_files=[n for n in read_manifest(path)["files"]
                                                     if n.startswith(f"{sets[which]}/")])
        return read_dcp(path / sets[which], device=map_location)
    manifest = verify_snapshot(path, hash_files=[fname])
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

    Use this deliberately when the config changed in a resume-relevant key (see the module
    docstring); optimizer state, spike-guard baselines, RNG streams and the data cursor are
    NOT restored and start fresh. ``which`` may name an extra tensor set (``"ema"``). With
    ``strict``, missing, unexpected or differently shaped keys raise CheckpointError listing
    them. Returns ``{"warm_start_from": path, "step": …}`` for the trainer state and logs.
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
        step = json.loads((snapshot_dir / TRAINER_STATE).read_text()).get("step")
    except (OSError, ValueError):
        step = None
    log.info("warm start: loaded %s weights from %s (step %s); optimizer, guard, RNG and "
             "cursor start fresh", which, snapshot_dir, step)
    return {"warm_start_from": str(snapshot_dir), "step": step, "weights": which}
