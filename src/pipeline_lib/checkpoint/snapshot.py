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
:mod:`.restore` reads both kinds. The file names and the checks both writers share live in
:mod:`.contents`.

Everything is written into a hidden temporary sibling (each file fsynced, then the
directory), then renamed onto the final name; see :mod:`.fsutil`. Restoring verifies the
manifest first. Tensors live only in safetensors, everything else in JSON: no pickle.
After the weights, the optimizer state, the config and each extra file, the writer calls
:func:`.write_hooks.file_written`: a seam where fault tests pause it to SIGKILL it
mid-write (production installs no hook).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .contents import (
    CONFIG_FILE,
    MODEL_FILE,
    OPTIMIZER_JSON,
    OPTIMIZER_TENSORS,
    RNG_JSON,
    RNG_TENSORS,
    TRAINER_STATE,
    check_snapshot_contents,
    prepare_snapshot_tmp,
)
from .manifest import staged_snapshot, write_bytes_file
from .tensorio import dumps_json, split_tree, write_safetensors
from .write_hooks import file_written

log = logging.getLogger(__name__)

__all__ = ["write_snapshot"]


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
        records[CONFIG_FILE] = write_bytes_file(tmp / CONFIG_FILE, config_yaml, "config")
        file_written(tmp / CONFIG_FILE)
        for name, tensors in sorted(extra_tensors.items()):
            fname = f"{name}.safetensors"
            records[fname] = write_safetensors(tmp / fname, tensors, role="extra_tensors")
            file_written(tmp / fname)
        for name, data in sorted(extra_files.items()):
            records[name] = write_bytes_file(tmp / name, data, "extra_file")
            file_written(tmp / name)
    total = sum(r["size"] for r in records.values())
    log.info("wrote snapshot %s (%.1f MB in %.2f s)", out_dir, total / 1e6,
             time.perf_counter() - started)
    return out_dir
