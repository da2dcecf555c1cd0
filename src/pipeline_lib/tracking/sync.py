"""Replay outboxes into the current store: idempotent, resumable.

Every operation is safe to apply twice: parents are found by their ``loopline.run`` tag,
children by their ``loopline.key`` tag, params only fill missing keys, tags are mutable,
artifacts overwrite the same path, and metrics follow the exactly-once rule of
:mod:`~pipeline_lib.tracking.commit` (a step at or below a key's stored step is dropped).
On top of that, ``tracking_outbox.sync.json`` records how far each store got, so a second
sync reads nothing and a sync interrupted half-way resumes where it stopped.

A record the store refuses for good (not a reachability problem) is skipped with a
warning, so one bad record cannot block every later stage's automatic replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TrackingError
from ..run_layout import OUTBOX_FILE, ResultsLayout, RunLayout
from .commit import commit_points, latest_steps, log_params_once, set_tags
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


class _Replayer:
    def __init__(self, client: Any, uri: str, ids: dict[str, str]) -> None:
        self.client, self.uri, self.ids = client, uri, ids
        self.experiments: dict[str, str] = {}
        self.committed: dict[str, dict[str, int]] = {}

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
            self.ids[rec["id"]] = find_or_create_parent(self.client, exp, rec["run"], rec["tags"])
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
            run_id = self._run(rec["run"])
            if run_id not in self.committed:
                self.committed[run_id] = latest_steps(self.client, run_id)
            points = [(k, float(v), int(s), int(t)) for k, v, s, t in rec["points"]]
            report.metrics += commit_points(self.client, run_id, points, self.committed[run_id])
        elif op == "artifact":
            self._artifact(self._run(rec["run"]), Path(rec["path"]), rec.get("artifact_path"))
        elif op == "status":
            set_status(self.client, self._run(rec["run"]), rec["status"], rec.get("time_ms"))
        else:
            raise TrackingError(f"unknown outbox operation {op!r}")

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
    """
    from mlflow.exceptions import MlflowException

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
        replayer = _Replayer(call(get_client, uri, what=f"open {uri}"), uri, ids)
        done = start
        try:
            for index, rec in outbox.lines(start):
                report.records += 1
                if rec is None:
                    report.skipped += 1
                else:
                    try:
                        replayer.apply(rec, report)
                    except (MlflowException, TrackingError, KeyError, ValueError) as exc:
                        if isinstance(exc, StoreUnavailable):
                            raise
                        report.skipped += 1
                        log.warning("%s line %d (%s) not replayed: %s", outbox.path, index + 1,
                                    rec.get("op"), str(exc).splitlines()[0][:300])
                done = index + 1
                if report.records % CHECKPOINT_EVERY == 0:
                    state.update(uri, done, ids)
        finally:
            state.update(uri, done, ids)
    log.info("synced %s into %s: %d records, %d runs, %d metric points, %d skipped",
             outbox.path, uri, report.records, report.runs, report.metrics, report.skipped)
    return report


def outbox_dirs(results_dir: Path) -> list[Path]:
    """Run directories under ``results_dir`` that hold an outbox."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return []
    return ResultsLayout(results_dir).run_dirs_with(OUTBOX_FILE)
