"""Which segment snapshots are kept: decided when each one is written, never after.

A segment writes its snapshot to ``snapshots/step_…`` (kept) or ``snapshots/transient/step_…``
(temporary: Snakemake deletes it once the next segment has read it), as ``snapshots.keep_last``
and ``keep_every`` say (:func:`~pipeline_lib.spec.snapshots.kept_steps`). That path is also the
next segment's input: were a changed setting to move an already written snapshot, Snakemake
would retrain the next segment (its set of input files changed) and rebuild a newly kept one
that is gone, from the start. So the settings decide only the snapshots not written yet:

- a snapshot written as kept stays kept (and listed in ``index.json``) when the settings no
  longer keep it: nothing is deleted because a number went down, and no kept snapshot lies
  outside the index;
- a temporary one stays temporary when the settings now keep it: once deleted it cannot come
  back without retraining, so it is not brought back (:attr:`Retention.lost`, one log line).

What was written comes from the run directory: the snapshots there, ``index.json`` and the
ledger ``snapshots/retention.json``, which each segment job of the workflow extends
(:func:`record_written`) with where its snapshot went and the train signature it was trained
under. A ledger of another signature describes snapshots that will be trained again: then
only the kept snapshots on disk stay (trained again in place), and the settings decide the
rest. A run made before the ledger existed is read from its snapshots and index alone.
Torch-free, and cheap: the plan reads it on every Snakemake call (two directory listings and
two small JSON files per run).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..fsio import write_text_atomic
from .config import SnapshotsConfig
from .layout import RunLayout
from .snapshots import kept_steps

LEDGER_FORMAT = 1
_STEP_PREFIX = "step_"


@dataclass(frozen=True)
class Retention:
    """Where the plan puts each segment's snapshot, and how that differs from the settings."""

    kept: list[int]  # segment ends whose snapshots are, or will be, kept (sorted)
    lost: list[int]  # kept by the settings now, but written temporary: they stay so
    held: list[int]  # written kept, no longer kept by the settings: they stay kept


@dataclass(frozen=True)
class Ledger:
    """``snapshots/retention.json``: the snapshots written under one train signature."""

    signature: str
    kept: frozenset[int]
    transient: frozenset[int]


def read_ledger(path: Path) -> Ledger | None:
    """The ledger at ``path``; None when there is none or it is not one (then the snapshots
    on disk and the index speak alone)."""
    try:
        doc = json.loads(Path(path).read_text())
        return Ledger(signature=str(doc["signature"]), kept=frozenset(map(int, doc["kept"])),
                      transient=frozenset(map(int, doc["transient"])))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_written(layout: RunLayout, step: int, *, kept: bool, signature: str) -> None:
    """Add the snapshot of the segment ending at ``step`` to the run's ledger, kept or
    temporary, under the train ``signature`` (a ledger of another one starts anew: its
    snapshots are being trained again). One segment job of a run trains at a time (the
    training lease), so the read and the atomic rewrite do not race."""
    ledger = read_ledger(layout.retention)
    if ledger is None or ledger.signature != signature:
        ledger = Ledger(signature, frozenset(), frozenset())
    kept_steps_ = (ledger.kept | {step}) if kept else (ledger.kept - {step})
    transient = (ledger.transient - {step}) if kept else (ledger.transient | {step})
    doc = {"format": LEDGER_FORMAT, "signature": signature, "kept": sorted(kept_steps_),
           "transient": sorted(transient)}
    layout.retention.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(layout.retention, json.dumps(doc) + "\n")


def retention(layout: RunLayout, ends: list[int], snapshots: SnapshotsConfig,
              signature: str) -> Retention:
    """The kept segment ends of a run whose segments end at ``ends`` (see the module
    docstring): as written up to the newest snapshot on disk, as the ``snapshots`` settings
    say after it. ``signature``: the run's train signature now."""
    policy = set(kept_steps(ends, snapshots))
    ends_set = set(ends)
    on_kept = _steps_in(layout.snapshots_dir) & ends_set
    on_disk = on_kept | (_steps_in(layout.temp_snapshots_dir) & ends_set)
    ledger = read_ledger(layout.retention)
    if ledger is not None and ledger.signature != signature:
        kept = policy | on_kept  # trained again: what lies at the kept path stays there
        return _retention(kept, policy, lost=set())
    frontier = max(on_disk, default=None)
    if frontier is None:
        return _retention(policy, policy, lost=set())
    written_kept = on_kept | _indexed(layout.index) | (ledger.kept if ledger else frozenset())
    kept = {s for s in ends if s <= frontier and s in written_kept}
    kept |= {s for s in policy if s > frontier}
    return _retention(kept, policy, lost={s for s in policy if s <= frontier} - kept)


def _retention(kept: set[int], policy: set[int], lost: set[int]) -> Retention:
    return Retention(kept=sorted(kept), lost=sorted(lost), held=sorted(kept - policy))


def _steps_in(folder: Path) -> set[int]:
    """The steps of the ``step_…`` directories in ``folder`` (none when it is missing)."""
    try:
        names: Iterable[str] = os.listdir(folder)
    except OSError:
        return set()
    return {int(n[len(_STEP_PREFIX):]) for n in names
            if n.startswith(_STEP_PREFIX) and n[len(_STEP_PREFIX):].isdigit()}


def _indexed(index: Path) -> set[int]:
    """The steps ``index.json`` lists as kept (a kept snapshot deleted by hand is rebuilt)."""
    try:
        return {int(e["step"]) for e in json.loads(index.read_text())["kept"]}
    except (OSError, ValueError, KeyError, TypeError):
        return set()


__all__ = ["Ledger", "Retention", "read_ledger", "record_written", "retention"]
