"""Replay outboxes into the current store: idempotent, resumable.

Every operation is safe to apply twice: parents are found by their ``loopline.run`` tag,
children by their ``loopline.key`` tag, params only fill missing keys, tags are mutable,
artifacts overwrite the same path, metrics follow the exactly-once rule of
:mod:`~pipeline_lib.tracking.commit` (a step at or below a key's stored step is dropped;
headline records, ``versioned``, drop a (key, step, timestamp) the run holds), dataset
inputs and logged models are found again (:mod:`~pipeline_lib.tracking.lineage`).
On top of that, ``tracking_outbox.sync.json`` records how far each store got, so a second
sync reads nothing and a sync interrupted half-way resumes where it stopped.

A record the store refuses for good (not a reachability problem) is skipped with a
warning, so one bad record cannot block every later stage's automatic replay.

Only files inside the run directory being synced are uploaded: an ``artifact`` record whose
path (relative to the run directory, or absolute in older outboxes) leads outside it, by an
absolute path elsewhere, ``..`` or a symbolic link, also one inside a directory it names,
is refused with an error line naming the outbox line and the file, and listed in
:attr:`SyncReport.refused`; the other records are replayed. Anyone who can append to an
outbox could otherwise have whoever runs ``sync-tracking`` upload any file they can read.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..credentials import error_line, redact_uri
from ..errors import TrackingError
from ..spec.layout import OUTBOX_FILE, ResultsLayout, RunLayout
from .commit import commit_points, commit_versioned, latest_steps, log_params_once, set_tags
from .lineage import log_dataset, log_model
from .outbox import Outbox, SyncState, is_local_id
from .runs import find_or_create_child, find_or_create_parent, set_status
from .store import StoreUnavailable, call, ensure_store, file_lock, get_client, probe

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 50  # records between progress writes (replay is idempotent anyway)


@dataclass
class SyncReport:
    """What one replay did."""

    records: int = 0  # records read past the recorded progress
    runs: int = 0  # parent and child runs found or created
    metrics: int = 0  # metric points newly committed
    skipped: int = 0  # unreadable or refused records
    refused: list[str] = field(default_factory=list)  # artifact records naming outside files


class OutboxPathError(TrackingError):
    """An outbox ``artifact`` record names a file outside the run directory being synced."""


def outside_file(path: Path, root: Path) -> Path | None:
    """The first file ``path`` would upload that lies outside ``root`` (``path`` itself, or
    a symbolic link in the directory it names), following links; None if all lie inside."""
    root = root.resolve()
    if not path.resolve().is_relative_to(root):
        return path
    if path.is_dir():
        for folder, dirs, files in os.walk(path):
            for name in sorted(dirs + files):
                entry = Path(folder) / name
                if entry.is_symlink() and not entry.resolve().is_relative_to(root):
                    return entry
    return None


class _Replayer:
    def __init__(self, client: Any, uri: str, ids: dict[str, str], run_dir: Path) -> None:
        self.client, self.uri, self.ids, self.run_dir = client, uri, ids, run_dir
        self.experiments: dict[str, str] = {}
        self.committed: dict[str, dict[str, int]] = {}
        self.versioned: dict[str, dict[str, set[tuple[int, int]]]] = {}

    def _experiment(self, name: str) -> str:
        if name not in self.experiments:
            self.experiments[name] = ensure_store(self.uri, name)
        return self.experiments[name]

    def _run(self, run_id: str) -> str:
        if is_local_id(run_id):
            if run_id not in self.ids:
                raise TrackingError(f"outbox refers to run {run_id} before creating it")
            return self.ids[run_id]
        return run_id

    def apply(self, rec: dict[str, Any], report: SyncReport) -> None:
        op = rec["op"]
        if op == "parent":
            exp = self._experiment(rec["experiment"])
            self.ids[rec["id"]] = find_or_create_parent(self.client, exp, rec["run"], rec["tags"],
                                                        rec.get("time_ms"))
            report.runs += 1
        elif op == "child":
            exp = self._experiment(rec["experiment"])
            self.ids[rec["id"]] = find_or_create_child(
                self.client, exp, rec["id"], self._run(rec["parent"]), rec["run_name"],
                rec["tags"], rec.get("time_ms"))
            report.runs += 1
        elif op == "params":
            log_params_once(self.client, self._run(rec["run"]), rec["params"])
        elif op == "tags":
            set_tags(self.client, self._run(rec["run"]), rec["tags"])
        elif op == "metrics":
            self._metrics(self._run(rec["run"]), rec, report)
        elif op == "dataset":
            log_dataset(self.client, self._run(rec["run"]), rec["dataset"], rec["context"])
        elif op == "model":
            files = [self._confined(name) for name in rec["files"]]
            log_model(self.client, self._experiment(rec["experiment"]), self._run(rec["run"]),
                      rec["spec"], files)
        elif op == "artifact":
            self._artifact(self._run(rec["run"]), self._confined(rec["path"]),
                           rec.get("artifact_path"))
        elif op == "status":
            set_status(self.client, self._run(rec["run"]), rec["status"], rec.get("time_ms"))
        else:
            raise TrackingError(f"unknown outbox operation {op!r}")

    def _metrics(self, run_id: str, rec: dict[str, Any], report: SyncReport) -> None:
        points = [(k, float(v), int(s), int(t)) for k, v, s, t in rec["points"]]
        if rec.get("versioned"):  # headline results: one point per (key, step, version)
            known = self.versioned.setdefault(run_id, {})
            report.metrics += commit_versioned(self.client, run_id, points, known)
            return
        if run_id not in self.committed:
            self.committed[run_id] = latest_steps(self.client, run_id)
        report.metrics += commit_points(self.client, run_id, points, self.committed[run_id])

    def _confined(self, name: str) -> Path:
        """The record's path (relative to the run directory); OutboxPathError if any file
        it would upload lies outside the run directory."""
        path = Path(name) if Path(name).is_absolute() else self.run_dir / name
        outside = outside_file(path, self.run_dir)
        if outside is not None:
            shown = outside if outside == path else f"{outside} (in {path})"
            raise OutboxPathError(f"{shown} is outside the run directory {self.run_dir}")
        return path

    def _artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        if not path.exists():
            log.warning("artifact %s no longer exists; not replayed", path)
            return
        if path.is_dir():
            call(self.client.log_artifacts, run_id, str(path), artifact_path,
                 what=f"log artifacts {path.name}")
        else:
            call(self.client.log_artifact, run_id, str(path), artifact_path,
                 what=f"log artifact {path.name}")


def sync_outbox(run_dir: Path, uri: str) -> SyncReport:
    """Replay ``run_dir``'s outbox into store ``uri`` from the recorded progress on.

    Raises StoreUnavailable if the store cannot be reached (progress so far is kept).
    Artifact records naming files outside ``run_dir`` are refused and listed in the
    report's ``refused``; the caller decides whether that fails (``sync-tracking`` does).
    """
    run_dir = Path(run_dir)
    report = SyncReport()
    outbox = Outbox(run_dir)
    if not outbox.path.is_file():
        return report
    with file_lock(RunLayout.at(run_dir).outbox_sync_lock):
        state = SyncState(run_dir)  # read under the lock: another sync may have advanced it
        start = state.lines_done(uri)
        if outbox.count() <= start:
            return report
        reason = probe(uri)
        if reason is not None:
            raise StoreUnavailable(reason)
        ids = state.ids(uri)
        replayer = _Replayer(call(get_client, uri, what=f"open {redact_uri(uri)}"), uri, ids,
                             run_dir)
        done = start
        try:
            for index, rec in outbox.lines(start):
                report.records += 1
                _replay_line(replayer, rec, f"{outbox.path} line {index + 1}", report)
                done = index + 1
                if report.records % CHECKPOINT_EVERY == 0:
                    state.update(uri, done, ids)
        finally:
            state.update(uri, done, ids)
    log.info("synced %s into %s: %d records, %d runs, %d metric points, %d skipped",
             outbox.path, redact_uri(uri), report.records, report.runs, report.metrics,
             report.skipped)
    return report


def _replay_line(replayer: _Replayer, rec: dict[str, Any] | None, where: str,
                 report: SyncReport) -> None:
    """Apply one record; count and report what cannot be (StoreUnavailable propagates)."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.exceptions import MlflowException

    if not isinstance(rec, dict):  # unreadable (torn) or not a record
        report.skipped += 1
        return
    try:
        replayer.apply(rec, report)
    except OutboxPathError as exc:
        report.skipped += 1
        report.refused.append(f"{where} (artifact): {exc}; not uploaded")
        log.error("%s", report.refused[-1])
    except (MlflowException, TrackingError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, StoreUnavailable):
            raise
        report.skipped += 1
        log.warning("%s (%s) not replayed: %s", where, rec.get("op"),
                    error_line(exc, 300))


def outbox_dirs(results_dir: Path) -> list[Path]:
    """Run directories under ``results_dir`` that hold an outbox."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return []
    return ResultsLayout(results_dir).run_dirs_with(OUTBOX_FILE)
