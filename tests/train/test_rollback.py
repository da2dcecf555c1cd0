"""Rollback records: written atomically, applied only to a retry from the same snapshot
under the same train signature."""

from __future__ import annotations

from pathlib import Path

from pipeline_lib.data.loader import DataCursor
from pipeline_lib.train import rollback

SIG = "0123abcd"


def _record(snapshot: Path | None, step: int, signature: str = SIG) -> dict:
    return rollback.make_record(
        input_snapshot=snapshot, input_step=step, abort_step=step + 4, first_bad_step=step + 2,
        window_start=DataCursor(0, 16), window_end=DataCursor(0, 40),
        resume_cursor=DataCursor(1, 2), skip_steps=3, attempt=1, signature=signature)


def test_record_round_trip_and_matching(tmp_path: Path) -> None:
    run = tmp_path / "run"
    snapshot = run / "snapshots" / "step_0000010"
    snapshot.mkdir(parents=True)
    assert rollback.matching_record(run, snapshot, 10, SIG) is None  # no record yet
    path = rollback.write_record(run, _record(snapshot, 10))
    assert path == run / "train" / "rollback.json"
    record = rollback.matching_record(run, snapshot, 10, SIG)
    assert record is not None and record["window_steps"] == [12, 14]
    assert record["window_cursor"] == [[0, 16], [0, 40]] and record["resume_cursor"] == [1, 2]
    assert rollback.matching_record(run, run / "snapshots" / "step_0000020", 10, SIG) is None
    assert rollback.matching_record(run, snapshot, 20, SIG) is None
    assert rollback.matching_record(run, None, 10, SIG) is None
    assert not rollback.clear_record(run, snapshot, 20) and path.exists()  # not this input's
    assert rollback.clear_record(run, snapshot, 10) and not path.exists()


def test_scratch_record_and_damaged_file(tmp_path: Path) -> None:
    rollback.write_record(tmp_path, _record(None, 0))
    assert rollback.matching_record(tmp_path, None, 0, SIG) is not None
    rollback.rollback_path(tmp_path).write_text("{not json")
    assert rollback.matching_record(tmp_path, None, 0, SIG) is None


def test_a_record_of_another_signature_is_not_applied_but_cleared(tmp_path: Path) -> None:
    """The abort happened under another config (say another train.lr): its data window says
    nothing about this one, so a retry does not jump; the segment's end removes it."""
    snapshot = tmp_path / "snapshots" / "step_0000010"
    path = rollback.write_record(tmp_path, _record(snapshot, 10, signature="feedbeef"))
    assert rollback.matching_record(tmp_path, snapshot, 10, SIG) is None
    assert rollback.matching_record(tmp_path, snapshot, 10, "feedbeef") is not None
    assert rollback.clear_record(tmp_path, snapshot, 10) and not path.exists()
