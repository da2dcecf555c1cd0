"""The offline outbox: an append-only JSONL log of tracking operations, and sync progress.

``{run_dir}/tracking_outbox.jsonl`` holds one operation per line, enough to recreate the
runs in any store later (:mod:`pipeline_lib.tracking.sync`). Runs created while offline
get a local id ``local:<hex>``; records refer to runs by that id or by a real run id.

Record kinds (``op``): ``parent`` and ``child`` (create; with experiment name, run name,
tags, and for a child its parent id), ``params``, ``tags``, ``metrics`` (points
``[key, value, step, timestamp_ms]``; ``versioned: true`` for headline results), ``artifact``
(a path relative to the run directory, uploaded at sync time; older outboxes hold absolute
paths), ``status``, ``dataset`` (a dataset input: its fields and context) and ``model`` (a
logged model: its spec and files relative to the run directory).

Appends take an exclusive ``flock`` and end in ``fsync``: parallel stages of one run may
share the file, and a record is durable before the stage goes on. A line torn by a crash
is closed with a newline by the next append and skipped (with a warning) by readers.

``tracking_outbox.sync.json`` records, per store URI (without credentials), how many lines
were replayed and which real run id each local id became, so a half-replayed outbox
resumes and later stages can continue a run that was created offline.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..credentials import redact_uri
from ..fsio import write_text_atomic
from ..spec.layout import RunLayout
from .run_files import tracking_io

log = logging.getLogger(__name__)

LOCAL_PREFIX = "local:"


def is_local_id(run_id: str | None) -> bool:
    return bool(run_id) and str(run_id).startswith(LOCAL_PREFIX)


class Outbox:
    """Append and read the outbox of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunLayout.at(run_dir).outbox

    def append(self, record: dict[str, Any]) -> None:
        """Append one record durably (flock, single write, fsync)."""
        line = json.dumps(record, separators=(",", ":"), allow_nan=True) + "\n"
        with tracking_io(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                size = os.fstat(fd).st_size
                if size and _last_byte(self.path) != b"\n":
                    line = "\n" + line  # close a line torn by a crashed writer
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    def lines(self, start: int = 0) -> Iterator[tuple[int, dict[str, Any] | None]]:
        """(line index, record) for every complete line from ``start``; None if unreadable.

        A last line without its newline is still being written (or torn): it is not
        yielded, so its index is not counted as done.
        """
        if not self.path.is_file():
            return
        with open(self.path, "rb") as handle:
            for index, raw in enumerate(handle):
                if not raw.endswith(b"\n"):
                    return
                if index < start:
                    continue
                if not raw.strip():
                    yield index, None
                    continue
                try:
                    yield index, json.loads(raw)
                except ValueError:
                    log.warning("%s line %d is not valid JSON (torn by a crash?); skipped",
                                self.path, index + 1)
                    yield index, None

    def count(self) -> int:
        """Number of complete lines."""
        if not self.path.is_file():
            return 0
        with open(self.path, "rb") as handle:
            return sum(1 for raw in handle if raw.endswith(b"\n"))


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


class SyncState:
    """Replay progress of one outbox, per store URI: lines done and local → real ids."""

    def __init__(self, run_dir: Path) -> None:
        self.path = RunLayout.at(run_dir).outbox_sync_state
        self._data: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            try:
                self._data = json.loads(self.path.read_text())
            except ValueError:
                log.warning("%s is not valid JSON; replaying the outbox from the start "
                            "(replay is idempotent)", self.path)

    def _store(self, uri: str) -> dict[str, Any]:
        return self._data.setdefault(_key(uri), {"lines_done": 0, "ids": {}})

    def lines_done(self, uri: str) -> int:
        return int(self._data.get(_key(uri), {}).get("lines_done", 0))

    def ids(self, uri: str) -> dict[str, str]:
        return dict(self._data.get(_key(uri), {}).get("ids", {}))

    def update(self, uri: str, lines_done: int, ids: dict[str, str]) -> None:
        """Record progress atomically (write a temporary sibling, then rename)."""
        store = self._store(uri)
        store["lines_done"] = lines_done
        store["ids"] = dict(ids)
        write_text_atomic(self.path, json.dumps(self._data, indent=1, sort_keys=True))


def _key(uri: str) -> str:
    """A store's key in the sync state: its URI without credentials."""
    return redact_uri(uri) or uri


def pending_lines(run_dir: Path, uri: str) -> int:
    """Outbox lines not yet replayed into ``uri``."""
    return max(Outbox(run_dir).count() - SyncState(run_dir).lines_done(uri), 0)
