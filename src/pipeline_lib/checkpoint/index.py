"""``snapshots/index.json`` (the kept snapshots) and the ``snapshots/final`` link."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import CheckpointError
from ..fsio import write_text_atomic
from ..spec.layout import FINAL_LINK
from .contents import TRAINER_STATE
from .manifest import read_manifest


def _trainer_step(snapshot: Path) -> int:
    state = json.loads((snapshot / TRAINER_STATE).read_text())
    return int(state["step"])


def write_index(index_path: Path, kept: Sequence[Path]) -> dict:
    """List the kept snapshots (step, directory, manifest file count) and point
    ``final`` at the last one. Both are replaced atomically."""
    if not kept:
        raise CheckpointError(f"{index_path}: no kept snapshots to index; train first")
    entries = []
    for snap in kept:
        snap = Path(snap)
        manifest = read_manifest(snap)
        entries.append({"step": _trainer_step(snap), "path": snap.name,
                        "files": len(manifest["files"])})
    entries.sort(key=lambda e: e["step"])
    doc = {"kept": entries, "final": entries[-1]["path"], "final_step": entries[-1]["step"]}
    index_path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(index_path, json.dumps(doc, indent=2) + "\n")
    link = index_path.parent / FINAL_LINK
    tmp_link = index_path.parent / f".{FINAL_LINK}.tmp"
    if os.path.lexists(tmp_link):
        tmp_link.unlink()
    os.symlink(entries[-1]["path"], tmp_link)
    os.replace(tmp_link, link)
    return doc
