"""Retention is decided when a snapshot is written: the snapshots settings place only the
snapshots not written yet (spec.retention)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline_lib.spec.config import SnapshotsConfig
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.spec.retention import Retention, read_ledger, record_written, retention

ENDS = [2, 4, 6]  # three segments; keep_last 2 keeps 4 and 6
SIG = "0123456789ab"


def _layout(tmp_path: Path, kept: tuple[int, ...] = (), transient: tuple[int, ...] = (),
            index: tuple[int, ...] | None = None) -> RunLayout:
    layout = RunLayout(tmp_path / "results", "solo")
    for step in kept:
        layout.snapshot(step).mkdir(parents=True)
    for step in transient:
        layout.snapshot(step, kept=False).mkdir(parents=True)
    if index is not None:
        layout.index.parent.mkdir(parents=True, exist_ok=True)
        layout.index.write_text(json.dumps({"kept": [{"step": s} for s in index]}))
    return layout


def _keep(last: int, every: int = 0) -> SnapshotsConfig:
    return SnapshotsConfig(keep_last=last, keep_every=every)


def test_nothing_written_the_settings_decide(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    assert retention(layout, ENDS, _keep(2), SIG) == Retention(kept=[4, 6], lost=[], held=[])
    assert retention(layout, ENDS, _keep(3), SIG).kept == [2, 4, 6]


def test_a_finished_run_keeps_what_it_wrote_whatever_keep_last_says(tmp_path: Path) -> None:
    """A run made before the ledger: its snapshots and index say what was written."""
    layout = _layout(tmp_path, kept=(4, 6), index=(4, 6))
    assert retention(layout, ENDS, _keep(2), SIG) == Retention(kept=[4, 6], lost=[], held=[])
    # grown: step 2 was temporary and is gone; it stays temporary (no retraining)
    assert retention(layout, ENDS, _keep(3), SIG) == Retention(kept=[4, 6], lost=[2], held=[])
    assert retention(layout, ENDS, _keep(1, every=2), SIG) == Retention(
        kept=[4, 6], lost=[2], held=[])
    # shrunk: step 4 was written kept; it stays kept and listed
    assert retention(layout, ENDS, _keep(1), SIG) == Retention(kept=[4, 6], lost=[], held=[4])


def test_a_deleted_kept_snapshot_stays_kept_and_is_rebuilt(tmp_path: Path) -> None:
    # listed in the index (a finished run) or in the ledger (a run still training)
    layout = _layout(tmp_path, kept=(6,), index=(4, 6))
    assert retention(layout, ENDS, _keep(2), SIG).kept == [4, 6]
    other = _layout(tmp_path / "b", kept=(6,))
    for step, kept in ((2, False), (4, True), (6, True)):
        record_written(other, step, kept=kept, signature=SIG)
    assert retention(other, ENDS, _keep(2), SIG).kept == [4, 6]
    # everything deleted: trained again, as the settings say now
    assert retention(_layout(tmp_path / "c", index=(4, 6)), ENDS, _keep(3), SIG).kept == \
        [2, 4, 6]


def test_a_run_in_progress_places_only_what_it_has_not_written(tmp_path: Path) -> None:
    layout = _layout(tmp_path, transient=(2,))  # step 2 written, not read yet
    record_written(layout, 2, kept=False, signature=SIG)
    assert retention(layout, ENDS, _keep(3), SIG) == Retention(kept=[4, 6], lost=[2], held=[])
    assert retention(layout, ENDS, _keep(1), SIG) == Retention(kept=[6], lost=[], held=[])


def test_snapshots_of_another_training_are_placed_by_the_settings(tmp_path: Path) -> None:
    """A changed train signature trains every segment again: the settings place them, and
    what lies at the kept path stays there (trained again in place, no orphan)."""
    layout = _layout(tmp_path, kept=(4, 6), index=(4, 6))
    for step, kept in ((2, False), (4, True), (6, True)):
        record_written(layout, step, kept=kept, signature="old")
    assert retention(layout, ENDS, _keep(3), SIG) == Retention(kept=[2, 4, 6], lost=[], held=[])
    assert retention(layout, ENDS, _keep(1), SIG) == Retention(kept=[4, 6], lost=[], held=[4])


def test_the_ledger_records_each_snapshot_once_under_one_signature(tmp_path: Path) -> None:
    layout = _layout(tmp_path)
    assert read_ledger(layout.retention) is None
    record_written(layout, 2, kept=False, signature=SIG)
    record_written(layout, 4, kept=True, signature=SIG)
    record_written(layout, 2, kept=True, signature=SIG)  # trained again as a kept one
    ledger = read_ledger(layout.retention)
    assert (ledger.signature, ledger.kept, ledger.transient) == (SIG, {2, 4}, set())
    record_written(layout, 2, kept=False, signature="new")  # another training starts anew
    ledger = read_ledger(layout.retention)
    assert (ledger.signature, ledger.kept, ledger.transient) == ("new", set(), {2})
    layout.retention.write_text("{not json")
    assert read_ledger(layout.retention) is None  # then the run directory speaks alone
