"""``snapshots/best``: the snapshot with the lowest validation loss so far.

Which segment-end snapshot is best is only known during training, so rotation (decided
before training, :mod:`pipeline_lib.spec.snapshots`) cannot keep it. Instead every
training job calls :func:`update_best_snapshot` after writing its snapshot: when the new
validation loss is strictly lower, ``best/`` is rebuilt as hard links to the new snapshot's
files (no copy; the files survive when rotation deletes the step directory) plus
``BEST.json`` (step, source, val_loss), with a MANIFEST.json covering both, and swapped in
atomically. ``best/`` is therefore itself a valid snapshot, and its record cannot disagree
with its content. Torch-free.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..spec.layout import BEST_DIR
from .fsutil import clean_stale_siblings, link_or_copy, tmp_sibling
from .manifest import staged_snapshot, verify_snapshot, write_bytes_file

log = logging.getLogger(__name__)

BEST_INFO = "BEST.json"


def read_best(snapshots_dir: str | Path) -> dict[str, Any] | None:
    """``BEST.json`` of ``snapshots_dir/best`` ({"step", "source", "val_loss"}), or None.

    None also when ``best/`` is damaged (sizes/manifest; it is rebuilt on the next update).
    """
    best = Path(snapshots_dir) / BEST_DIR
    if not best.is_dir():
        return None
    try:
        verify_snapshot(best, hash_files=[BEST_INFO])
        return json.loads((best / BEST_INFO).read_text())
    except (CheckpointError, OSError, ValueError) as exc:
        log.warning("ignoring damaged %s: %s", best, exc)
        return None


def _source_step(step_dir: Path) -> int | None:
    try:
        step = json.loads((step_dir / "trainer_state.json").read_text()).get("step")
        return int(step) if step is not None else None
    except (OSError, ValueError, TypeError, AttributeError):
        name = step_dir.name
        return int(name[5:]) if name.startswith("step_") and name[5:].isdigit() else None


def update_best_snapshot(snapshots_dir: str | Path, step_dir: str | Path,
                         val_loss: float | None, *, new_history: bool = False) -> bool:
    """Make ``snapshots_dir/best`` a copy of ``step_dir`` when ``val_loss`` beats the record.

    Returns True when ``best/`` was replaced. A non-finite ``val_loss`` never becomes best,
    ties keep the earlier snapshot, None (no validation ran) changes nothing. ``step_dir``
    must be a complete snapshot (sizes checked). ``new_history``: ``step_dir`` is the first
    segment of a run trained from scratch, so an existing record (an earlier training of
    this run, e.g. before a config change) is replaced whatever its loss.
    """
    snapshots_dir, step_dir = Path(snapshots_dir), Path(step_dir)
    if val_loss is None:
        return False
    if not math.isfinite(val_loss):
        log.warning("validation loss %r of %s is not finite: best snapshot unchanged",
                    val_loss, step_dir)
        return False
    current = read_best(snapshots_dir)
    if current is not None and new_history:
        log.info("%s starts a new training history: dropping the earlier best (%s)",
                 step_dir.name, current["source"])
    elif current is not None and float(current["val_loss"]) <= val_loss:
        return False
    manifest = verify_snapshot(step_dir, hash_files=())
    target = snapshots_dir / BEST_DIR
    clean_stale_siblings(target)
    tmp = tmp_sibling(target)
    with staged_snapshot(tmp, target, f"update {target} from {step_dir}") as records:
        tmp.mkdir(parents=True)
        records.update({name: dict(rec) for name, rec in manifest["files"].items()
                        if name != BEST_INFO})
        for name in list(records):  # names may be nested (a sharded snapshot's DCP dirs)
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(step_dir / name, tmp / name)
        info = {"step": _source_step(step_dir), "source": step_dir.name, "val_loss": val_loss}
        records[BEST_INFO] = write_bytes_file(
            tmp / BEST_INFO, (json.dumps(info, indent=1) + "\n").encode(), "extra_file")
    log.info("best snapshot is now %s (val_loss %.6g, was %s)", step_dir.name, val_loss,
             None if current is None else current["val_loss"])
    return True
