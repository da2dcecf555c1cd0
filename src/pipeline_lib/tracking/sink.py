"""Where a process's tracking operations go: the store while it answers, else the outbox.

One :class:`Sink` per (store URI, run directory) and process. It probes the store once
(fast: see :func:`~pipeline_lib.tracking.store.probe`), replays a pending outbox of the run
directory first (so runs created offline exist before new stages refer to them), and from
the first :class:`~pipeline_lib.tracking.store.StoreUnavailable` on writes every operation
to the outbox: one warning per store, the stage keeps running. It never switches back
within a process, so the outbox keeps each run's operations in order.

Runs that exist only in the outbox (local ids not yet replayed) are always written to the
outbox, even when the store answers.

An artifact recorded in the outbox is named by its path relative to the run directory;
one outside it (the data pack's metadata, Snakemake benchmark files) is first copied
under ``tracking_files/outbox/``, because ``sync-tracking`` uploads only files inside the
run directory it syncs (:mod:`.sync`).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ..credentials import redact_uri
from ..spec.layout import RunLayout
from .commit import (
    Point,
    chunks,
    clean_params,
    clean_tags,
    commit_points,
    commit_versioned,
    latest_steps,
    log_params_once,
    select_new,
    set_tags,
)
from .lineage import log_dataset, log_model
from .outbox import LOCAL_PREFIX, Outbox, SyncState, is_local_id, pending_lines
from .runs import (
    KEY_TAG,
    find_or_create_child,
    find_or_create_parent,
    find_parent,
    run_exists,
    set_status,
)
from .store import StoreUnavailable, call, ensure_store, get_client, probe
from .sync import sync_outbox

log = logging.getLogger(__name__)

_SINKS: dict[tuple[str, str], Sink] = {}
_WARNED: set[str] = set()


def get_sink(uri: str, run_dir: Path) -> Sink:
    """The process-wide sink of ``run_dir`` for store ``uri``."""
    key = (uri, str(Path(run_dir).resolve()))
    if key not in _SINKS:
        _SINKS[key] = Sink(uri, Path(run_dir))
    return _SINKS[key]


def now_ms() -> int:
    return int(time.time() * 1000)


class Sink:
    """Routes the tracking operations of one run directory (see the module docstring)."""

    def __init__(self, uri: str, run_dir: Path) -> None:
        self.uri = uri
        self.label: str = redact_uri(uri) or uri  # the URI as written and logged
        self.run_dir = Path(run_dir)
        self.outbox = Outbox(self.run_dir)
        self.client: Any = None
        self.offline_reason: str | None = None
        self._experiments: dict[str, str] = {}
        self._committed: dict[str, dict[str, int]] = {}  # run id → key → last step
        self._versioned: dict[str, dict[str, set[tuple[int, int]]]] = {}  # → (step, time)
        reason = probe(uri)
        if reason is not None:
            self._go_offline(reason)
            return
        try:
            self.client = call(get_client, uri, what=f"open {redact_uri(uri)}")
        except StoreUnavailable as exc:
            self._go_offline(str(exc))
            return
        if pending_lines(self.run_dir, uri):
            try:
                sync_outbox(self.run_dir, uri)
            except StoreUnavailable as exc:
                self._go_offline(str(exc))
        self._ids = SyncState(self.run_dir).ids(uri)

    @property
    def online(self) -> bool:
        return self.offline_reason is None

    def _go_offline(self, reason: str) -> None:
        self.offline_reason = reason
        self._ids = {}
        if self.label not in _WARNED:
            _WARNED.add(self.label)
            log.warning("tracking store %s unreachable (%s); continuing, operations go to %s; "
                        "replay them later with `python -m pipeline_lib sync-tracking "
                        "--run-dir %s`", self.label, reason, self.outbox.path, self.run_dir)

    def resolve(self, run_id: str) -> str:
        """A local id's real id once replayed into this store, else the id unchanged."""
        return self._ids.get(run_id, run_id) if is_local_id(run_id) else run_id

    def _route(self, run_id: str | None, online_fn: Any, record: Any) -> Any:
        """Run ``online_fn`` against the store, or append ``record`` to the outbox
        (a dict, or a function making it: None records nothing)."""
        if self.online and not is_local_id(run_id):
            try:
                return online_fn()
            except StoreUnavailable as exc:
                self._go_offline(str(exc))
        if callable(record):
            record = record()
        if record is not None:
            self.outbox.append({**record, "pid": os.getpid()})
        return None

    # ------------------------------------------------------------------ runs

    def experiment_id(self, name: str) -> str | None:
        """The experiment's id (created once per process), None while offline."""
        if not self.online:
            return None
        if name not in self._experiments:
            try:
                self._experiments[name] = ensure_store(self.uri, name)
            except StoreUnavailable as exc:
                self._go_offline(str(exc))
                return None
        return self._experiments[name]

    def create_parent(self, experiment: str, run: str, tags: dict[str, Any],
                      local_id: str | None = None) -> str:
        """Find or create the parent run of ``run``; a local id while offline.

        ``local_id`` reuses the local id an earlier offline attempt wrote to tracking.json.
        """
        local = local_id if is_local_id(local_id) else LOCAL_PREFIX + uuid.uuid4().hex
        tags = clean_tags(tags)
        exp_id = self.experiment_id(experiment)
        record = {"op": "parent", "id": local, "experiment": experiment, "run": run,
                  "tags": tags, "time_ms": now_ms()}
        found = self._route(None if exp_id else local,
                            lambda: find_or_create_parent(self.client, exp_id, run, tags),
                            record)
        return found or local

    def find_parent(self, experiment: str, run: str) -> str | None:
        """The existing parent run of ``run`` in the store; None if absent or offline."""
        exp_id = self.experiment_id(experiment)
        if exp_id is None:
            return None
        try:
            return find_parent(self.client, exp_id, run)
        except StoreUnavailable as exc:
            self._go_offline(str(exc))
            return None

    def create_child(self, experiment: str, parent_id: str, run_name: str,
                     tags: dict[str, Any]) -> str:
        """Create a stage run under ``parent_id``; a local id while offline."""
        local = LOCAL_PREFIX + uuid.uuid4().hex
        parent_id = self.resolve(parent_id)
        tags = clean_tags({**tags, KEY_TAG: local})
        exp_id = self.experiment_id(experiment)
        start = now_ms()
        record = {"op": "child", "id": local, "experiment": experiment, "parent": parent_id,
                  "run_name": run_name, "tags": tags, "time_ms": start}
        created = self._route(
            parent_id if exp_id else local,
            lambda: find_or_create_child(self.client, exp_id, local, parent_id, run_name, tags,
                                         start),
            record)
        return created or local

    def continue_run(self, run_id: str) -> str | None:
        """The id to keep logging to, or None if the store has no such run (make a new one)."""
        run_id = self.resolve(run_id)
        # Another process (an earlier attempt) may have committed to it since we looked.
        self._committed.pop(run_id, None)
        if is_local_id(run_id) or not self.online:
            return run_id
        try:
            return run_id if run_exists(self.client, run_id) else None
        except StoreUnavailable as exc:
            self._go_offline(str(exc))
            return run_id

    # ------------------------------------------------------------------ data

    def log_params(self, run_id: str, params: dict[str, Any]) -> None:
        params = clean_params(params)
        if params:
            self._route(run_id, lambda: log_params_once(self.client, run_id, params),
                        {"op": "params", "run": run_id, "params": params})

    def set_tags(self, run_id: str, tags: dict[str, Any]) -> None:
        tags = clean_tags(tags)
        if tags:
            self._route(run_id, lambda: set_tags(self.client, run_id, tags),
                        {"op": "tags", "run": run_id, "tags": tags})

    def commit_metrics(self, run_id: str, points: list[Point]) -> int:
        """Commit points exactly once (see :mod:`.commit`); return how many were new.

        ``_committed`` caches, per run, the last step per key committed to the store or
        written to the outbox by this process; a store read fills it on first use.
        """
        if not points:
            return 0
        if self.online and not is_local_id(run_id):
            try:
                if run_id not in self._committed:
                    self._committed[run_id] = latest_steps(self.client, run_id)
                return commit_points(self.client, run_id, points, self._committed[run_id])
            except StoreUnavailable as exc:
                self._go_offline(str(exc))
        committed = self._committed.setdefault(run_id, {})
        todo = select_new(points, committed)
        for batch in chunks(todo):
            self.outbox.append({"op": "metrics", "run": run_id,
                                "points": [list(p) for p in batch], "pid": os.getpid()})
            for key, _, step, _ in batch:
                committed[key] = max(step, committed.get(key, step))
        return len(todo)

    def commit_versioned(self, run_id: str, points: list[Point]) -> int:
        """Commit points whose (key, step, timestamp) the run lacks (:func:`.commit.commit_versioned`:
        headline results, replaced by version); return how many were new."""
        if not points:
            return 0
        known = self._versioned.setdefault(run_id, {})
        if self.online and not is_local_id(run_id):
            try:
                return commit_versioned(self.client, run_id, points, known)
            except StoreUnavailable as exc:
                self._go_offline(str(exc))
        todo = [p for p in points if (p[2], p[3]) not in known.get(p[0], set())]
        for batch in chunks(todo):
            self.outbox.append({"op": "metrics", "versioned": True, "run": run_id,
                                "points": [list(p) for p in batch], "pid": os.getpid()})
        for key, _, step, stamp in todo:
            known.setdefault(key, set()).add((step, stamp))
        return len(todo)

    def log_dataset(self, run_id: str, dataset: dict[str, str], context: str) -> None:
        """Attach a dataset (:func:`.lineage.pack_dataset`) to the run as an input."""
        self._route(run_id, lambda: log_dataset(self.client, run_id, dataset, context),
                    {"op": "dataset", "run": run_id, "dataset": dataset, "context": context})

    def log_model(self, experiment: str, run_id: str, spec: dict[str, Any],
                  files: list[Path]) -> str | None:
        """Find or create the logged model ``spec`` describes (:func:`.lineage.log_model`) as
        an output of ``run_id``; its id, or None while offline (the outbox keeps it)."""
        run_id = self.resolve(run_id)

        def online() -> str | None:
            exp_id = self.experiment_id(experiment)
            if exp_id is None:
                raise StoreUnavailable(self.offline_reason or "store unreachable")
            return log_model(self.client, exp_id, run_id, spec, files)

        def record() -> dict[str, Any]:
            kept = [k for k in (self._outbox_copy(Path(f).absolute()) for f in files) if k]
            return {"op": "model", "run": run_id, "experiment": experiment, "spec": spec,
                    "files": kept}

        return self._route(run_id, online, record)

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None) -> None:
        path = Path(path).absolute()

        def online() -> None:
            if path.is_dir():
                self.client.log_artifacts(run_id, str(path), artifact_path)
            else:
                self.client.log_artifact(run_id, str(path), artifact_path)

        def record() -> dict[str, Any] | None:
            kept = self._outbox_copy(path)
            return None if kept is None else {"op": "artifact", "run": run_id, "path": kept,
                                              "artifact_path": artifact_path}

        self._route(run_id, lambda: call(online, what=f"log artifact {path.name}"), record)

    def _outbox_copy(self, path: Path) -> str | None:
        """``path`` relative to the run directory, copied under ``tracking_files/outbox/``
        first when it lies outside; None (with a warning) if it does not exist."""
        if not path.exists():
            log.warning("artifact %s does not exist; not recorded in %s", path, self.outbox.path)
            return None
        root = self.run_dir.resolve()
        if path.resolve().is_relative_to(root):
            return str(path.resolve().relative_to(root))
        copy = RunLayout.at(self.run_dir).tracking_files / "outbox" / uuid.uuid4().hex / path.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, copy)
        else:
            shutil.copy2(path, copy)
        return str(copy.resolve().relative_to(root))

    def set_status(self, run_id: str, status: str) -> None:
        stamp = now_ms()
        self._route(run_id, lambda: set_status(self.client, run_id, status, stamp),
                    {"op": "status", "run": run_id, "status": status, "time_ms": stamp})
