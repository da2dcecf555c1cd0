"""The outbox file: durable appends, torn lines, sync progress."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from pipeline_lib.tracking.outbox import (
    Outbox,
    SyncState,
    is_local_id,
    pending_lines,
)


def test_records_round_trip_in_order(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    records = [{"op": "metrics", "run": "local:a", "points": [["l", float("nan"), i, 0]]}
               for i in range(3)]
    for rec in records:
        box.append(rec)
    read = list(box.lines())
    assert [i for i, _ in read] == [0, 1, 2]
    assert [r["points"][0][2] for _, r in read] == [0, 1, 2]
    assert box.count() == 3
    assert [i for i, _ in box.lines(start=2)] == [2]


def test_torn_line_is_closed_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    box = Outbox(tmp_path)
    box.append({"op": "tags", "run": "r1", "tags": {}})
    with open(box.path, "a") as handle:
        handle.write('{"op": "metr')  # a writer died mid-line
    assert box.count() == 1  # an unterminated line is not complete yet
    assert [i for i, _ in box.lines()] == [0]
    box.append({"op": "tags", "run": "r2", "tags": {}})
    with caplog.at_level(logging.WARNING):
        read = list(box.lines())
    assert [(i, r and r["run"]) for i, r in read] == [(0, "r1"), (1, None), (2, "r2")]
    assert "line 2" in caplog.text


def test_sync_state_records_progress_per_store(tmp_path: Path) -> None:
    box = Outbox(tmp_path)
    for i in range(4):
        box.append({"op": "tags", "run": "r", "tags": {"i": i}})
    assert pending_lines(tmp_path, "sqlite:////a.db") == 4
    SyncState(tmp_path).update("sqlite:////a.db", 3, {"local:x": "abc"})
    state = SyncState(tmp_path)  # re-read from disk
    assert state.lines_done("sqlite:////a.db") == 3
    assert state.lines_done("http://other") == 0
    assert pending_lines(tmp_path, "sqlite:////a.db") == 1
    assert state.ids("sqlite:////a.db") == {"local:x": "abc"} and state.ids("http://other") == {}
    assert is_local_id("local:x") and not is_local_id("abc") and not is_local_id(None)
