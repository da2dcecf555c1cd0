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
:func:`load_snapshot` and :func:`load_model_state` read both kinds.

Everything is written into a hidden temporary sibling (each file fsynced, then the
directory), then renamed onto the final name; see :mod:`.fsutil`. Loading verifies the
manifest first. Tensors live only in safetensors, everything else in JSON: no pickle.

Test hook: when the environment variable ``LOOPLINE_TEST_SNAPSHOT_PAUSE_S`` is set, the
writer sleeps that many seconds after each file, so fault tests can SIGKILL it mid-write.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError
from ..snapshots_policy import step_dir_name
from .fsutil import clean_stale_siblings, tmp_sibling
from .manifest import (
    MANIFEST_NAME,
    read_manifest,
    staged_snapshot,
    verify_snapshot,
    write_bytes_file,
)
from .sharded import dcp_dirs, is_sharded, load_sharded_snapshot, read_dcp
from .tensorio import dumps_json, join_tree, read_safetensors, split_tree, write_safetensors

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
RNG_TENSORS = "rng.safetensors"
RNG_JSON = "rng.json"
TRAINER_STATE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
RESERVED_NAMES = frozenset({MODEL_FILE, OPTIMIZER_TENSORS, OPTIMIZER_JSON, RNG_TENSORS, RNG_JSON,
                            TRAINER_STATE, CONFIG_FILE, MANIFEST_NAME, "model_dcp",
                            "optimizer_dcp"})
_RANK_RNG_NAME = re.compile(r"^rng_rank\d+\.")
TEST_PAUSE_ENV = "LOOPLINE_TEST_SNAPSHOT_PAUSE_S"
__all__ = ["Snapshot", "find_snapshots", "load_model_state", "load_snapshot", "step_dir_name",
           "write_snapshot"]
STEP_DIR_PATTERN = re.compile(r"^step_(\d{7,})$")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


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
    # sharded snapshots loaded with consolidate=False: {set name: DCP directory}; the
    # tensors of those sets are then left out (model_state and optimizer tensors empty)
    dcp: dict[str, Path] = field(default_factory=dict)

    @property
    def sharded(self) -> bool:
        """Written by a multi-process run (weights and optimizer in DCP directories)."""
        return is_sharded(self.manifest)

    @property
    def step(self) -> int | None:
        """``trainer_state["step"]`` when the trainer recorded it."""
        step = self.trainer_state.get("step")
        return int(step) if step is not None else None


def _pause(after: str) -> None:
    """Fault-test hook: sleep after each file when ``LOOPLINE_TEST_SNAPSHOT_PAUSE_S`` is set."""
    delay = os.environ.get(TEST_PAUSE_ENV)
    if delay:
        log.warning("test hook: pausing %s s after writing %s", delay, after)
        time.sleep(float(delay))


def _check_json(obj: Any, where: str, path: str = "") -> None:
    """Plain JSON only: str keys; dicts, lists, tuples (read back as lists) and scalars."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_json(v, where, f"{path}/{i}")
        return
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CheckpointError(f"{where}: key {k!r} at '{path or '/'}' is not a str; "
                                      "JSON keys must be strings")
            _check_json(v, where, f"{path}/{k}")
        return
    raise CheckpointError(f"{where}: value at '{path or '/'}' is a {type(obj).__name__}; "
                          "trainer state must be plain JSON (tensors go into extra_tensors)")


def _check_extra_names(names: list[str]) -> None:
    for name in names:
        if not _EXTRA_NAME.match(name) or name in RESERVED_NAMES or _RANK_RNG_NAME.match(name):
            raise CheckpointError(f"extra snapshot file name '{name}' is reserved or not a plain "
                                  "file name; use letters, digits, '_', '-', '.' and no slashes")
    if len(set(names)) != len(names):
        raise CheckpointError(f"extra snapshot file names collide: {sorted(names)}; rename one")


def check_snapshot_contents(trainer_state: Mapping[str, Any], extra_names: list[str],
                            extra_files: Mapping[str, Any]) -> None:
    """Plain-JSON trainer state; extra names that are plain, unreserved and distinct."""
    _check_json(trainer_state, TRAINER_STATE)
    _check_extra_names([*extra_names, *extra_files])


def prepare_snapshot_tmp(out_dir: Path) -> Path:
    """The fresh hidden sibling to build ``out_dir`` in, after checking that an existing
    ``out_dir`` is a snapshot that may be replaced and removing dead writers' leftovers."""
    if os.path.lexists(out_dir):
        if out_dir.is_symlink() or not out_dir.is_dir():
            raise CheckpointError(f"snapshot output {out_dir} exists and is not a directory; "
                                  "remove it or choose another output path")
        try:
            verify_snapshot(out_dir, hash_files=())
        except CheckpointError as exc:
            raise CheckpointError(f"snapshot output {out_dir} already exists and is not a valid "
                                  f"snapshot ({exc}); remove it by hand or choose another "
                                  "output path") from None
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_siblings(out_dir)
        tmp = tmp_sibling(out_dir)
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointError(f"cannot create snapshot {out_dir}: {exc}; check the path and "
                              "permissions") from None
    return tmp


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
        _pause(MODEL_FILE)
        records[OPTIMIZER_TENSORS] = write_safetensors(tmp / OPTIMIZER_TENSORS, opt_tensors,
                                                       role="optimizer_tensors")
        records[OPTIMIZER_JSON] = write_bytes_file(tmp / OPTIMIZER_JSON, dumps_json(opt_doc),
                                                   "optimizer_json")
        _pause(OPTIMIZER_JSON)
        records[RNG_TENSORS] = write_safetensors(tmp / RNG_TENSORS, rng_tensors, role="rng_tensors")
        records[RNG_JSON] = write_bytes_file(tmp / RNG_JSON, dumps_json(rng_doc), "rng_json")
        records[TRAINER_STATE] = write_bytes_file(
            tmp / TRAINER_STATE, dumps_json(trainer_state), "trainer_state")
        records[CONFIG_FILE] = write_bytes_file(tmp / CONFIG_FILE, config_yaml.encode(), "config")
        _pause(CONFIG_FILE)
        for name, tensors in sorted(extra_tensors.items()):
            fname = f"{name}.safetensors"
            records[fname] = write_safetensors(tmp / fname, tensors, role="extra_tensors")
            _pause(fname)
        for name, data in sorted(extra_files.items()):
            blob = data.encode() if isinstance(data, str) else bytes(data)
            records[name] = write_bytes_file(tmp / name, blob, "extra_file")
            _pause(name)
    total = sum(r["size"] for r in records.values())
    log.info("wrote snapshot %s (%.1f MB in %.2f s)", out_dir, total / 1e6,
             time.perf_counter() - started)
    return out_dir


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}); the snapshot is corrupted, "
                              "rerun the segment that writes it") from None


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
        raise CheckpointError(f"snapshot {path} has no '{which}' weights (extra tensor sets: "
                              f"{have or 'none'}); use which='model' or train with it enabled")
    tensors, _ = read_safetensors(path / fname, device=map_location)
    return tensors


def find_snapshots(snapshots_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step_NNNNNNN`` directory with a manifest, by step.

    Presence of MANIFEST.json only (cheap); load or verify a candidate before trusting it.
    Hidden temporary siblings never match.
    """
    root = Path(snapshots_dir)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        m = STEP_DIR_PATTERN.match(entry.name)
        if m and entry.is_dir() and (entry / MANIFEST_NAME).is_file():
            found.append((int(m.group(1)), entry))
    return sorted(found)
