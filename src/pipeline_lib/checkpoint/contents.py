"""What a snapshot directory holds, for both writers (:mod:`.snapshot`, :mod:`.sharded`).

The file names of both kinds of snapshot, how to tell them apart by their manifest, the
checks on what a caller asks to store, and the hidden temporary sibling a write builds in.
Both writers and the reader (:mod:`.restore`) import this module and it imports none of
them. Torch-free.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..output_paths import check_creatable
from ..spec.names import is_name
from .fsutil import clean_stale_siblings, tmp_sibling
from .manifest import MANIFEST_NAME, verify_snapshot

# one process (see the table in :mod:`.snapshot`)
MODEL_FILE = "model.safetensors"
OPTIMIZER_TENSORS = "optimizer.safetensors"
OPTIMIZER_JSON = "optimizer.json"
RNG_TENSORS = "rng.safetensors"
RNG_JSON = "rng.json"
TRAINER_STATE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
# N ranks (see the table in :mod:`.sharded`)
DCP_SUFFIX = "_dcp"
MODEL_DCP = "model_dcp"
OPTIMIZER_DCP = "optimizer_dcp"
RESERVED_NAMES = frozenset({MODEL_FILE, OPTIMIZER_TENSORS, OPTIMIZER_JSON, RNG_TENSORS, RNG_JSON,
                            TRAINER_STATE, CONFIG_FILE, MANIFEST_NAME, MODEL_DCP,
                            OPTIMIZER_DCP})
_RANK_RNG_NAME = re.compile(r"^rng_rank\d+\.")
_EXTRA_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def rng_names(rank: int) -> tuple[str, str]:
    """File names of rank ``rank``'s RNG state (tensors, JSON) in a sharded snapshot."""
    return f"rng_rank{rank}.safetensors", f"rng_rank{rank}.json"


def dcp_dirs(manifest: Mapping[str, Any]) -> dict[str, str]:
    """``{set name: directory}`` of the DCP directories a manifest lists (``model``, …)."""
    out: dict[str, str] = {}
    for name in manifest["files"]:
        top = name.split("/", 1)[0]
        if "/" in name and top.endswith(DCP_SUFFIX):
            out[top.removesuffix(DCP_SUFFIX)] = top
    return out


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
        if not is_name(name, _EXTRA_NAME) or name in RESERVED_NAMES \
                or _RANK_RNG_NAME.match(name):
            raise CheckpointError(f"extra snapshot file name '{name}' is reserved or not a plain "
                                  "file name; use letters, digits, '_', '-', '.' and no slashes")
    if len(set(names)) != len(names):
        raise CheckpointError(f"extra snapshot file names collide: {sorted(names)}; rename one")


def check_snapshot_contents(trainer_state: Mapping[str, Any], extra_names: list[str],
                            extra_files: Mapping[str, Any]) -> None:
    """Plain-JSON trainer state; extra names that are plain, unreserved and distinct."""
    _check_json(trainer_state, TRAINER_STATE)
    _check_extra_names([*extra_names, *extra_files])


def check_snapshot_output(out_dir: Path) -> None:
    """``out_dir`` may receive a snapshot: new, or a complete snapshot to replace, in a
    creatable place. Cheap (no file is hashed); training calls it before building anything."""
    out_dir = Path(out_dir)
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
    check_creatable(out_dir, "snapshot output")


def prepare_snapshot_tmp(out_dir: Path) -> Path:
    """The fresh hidden sibling to build ``out_dir`` in, after checking that an existing
    ``out_dir`` is a snapshot that may be replaced and removing dead writers' leftovers."""
    check_snapshot_output(out_dir)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_siblings(out_dir)
        tmp = tmp_sibling(out_dir)
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointError(f"cannot create snapshot {out_dir}: {exc}; check the path and "
                              "permissions") from None
    return tmp
