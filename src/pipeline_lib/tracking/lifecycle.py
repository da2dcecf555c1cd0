"""The parent run's status follows its variant's pipeline.

Every Snakemake job of a run goes through :func:`pipeline_job` (the workflow scripts do,
through :func:`pipeline_lib.workflow.io.run_job`):

- when the job starts, the parent is set RUNNING (its end time then marks that moment, so
  the duration shown is the pipeline's so far) and the run directory gets the marker
  ``tracking_files/parent_running.json``; the first job, ``track_init``, which creates the
  parent, does so once it exists;
- a job that fails sets the parent FAILED; its retry or a rerun sets it RUNNING again (a
  preempted training segment leaves it RUNNING: Snakemake retries it);
- rule ``track_done``, whose inputs are every target of the run, sets it FINISHED once the
  last one is built (:func:`finish_parent`); the Snakefile's ``onsuccess`` and ``onerror``
  handlers end every parent still marked (a run of only some targets; a job killed before it
  could report). Ending removes the marker, so the handlers cost a file check per run when
  every run was closed by its rule.

The parent's start time is its creation by the run's first pipeline (``track_init``), so its
duration spans from there to the last target built, reruns included. A stage run alone
(``python -m pipeline_lib …``) leaves the parent's status as it is. Status changes go through
the outbox like everything else when the store cannot be reached.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..credentials import error_line
from ..errors import Preempted
from ..fsio import write_text_atomic
from ..spec.config import Config
from ..spec.layout import RunLayout
from .health import check_store
from .parent import parent_for_stage, read_tracking_info
from .sink import Sink, get_sink
from .store import resolve_uri

log = logging.getLogger(__name__)

T = TypeVar("T")


def _known_parent(cfg: Config, run_dir: Path) -> tuple[Sink, str] | None:
    """(sink, parent id) once tracking.json names a parent; None before or with tracking off."""
    info = read_tracking_info(run_dir)
    if not cfg.tracking.enabled or not info or not info.get("parent_run_id"):
        return None
    sink = get_sink(resolve_uri(cfg), Path(run_dir))
    return sink, parent_for_stage(cfg, Path(run_dir), sink)


def open_parent(sink: Sink, parent_id: str) -> None:
    """The parent RUNNING, the run directory marked (see the module docstring)."""
    marker = RunLayout.at(sink.run_dir).parent_open
    if not marker.is_file():
        marker.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(marker, json.dumps({"parent_run_id": parent_id,
                                              "since_ms": int(time.time() * 1000)}) + "\n")
    sink.set_status(parent_id, "RUNNING")


@contextlib.contextmanager
def pipeline_job(cfg: Config, run_dir: Path) -> Iterator[None]:
    """One Snakemake job of ``run_dir``'s pipeline: the parent RUNNING while it runs, FAILED
    if it raises (KILLED on an interrupt, untouched when preempted). Tracking errors here
    are warnings: they never mask the job's own outcome. A store that tracking.json relies on
    and that is missing, replaced or corrupt is refused first (:func:`.health.check_store`,
    one line): touching it would create a fresh store where the old one was moved away."""
    run_dir = Path(run_dir)
    check_store(cfg, run_dir)
    known = _guarded(lambda: _known_parent(cfg, run_dir))
    if known is not None:
        _guarded(lambda: open_parent(*known))
    try:
        yield
    except BaseException as exc:
        status = _failed_status(exc)
        known = known or _guarded(lambda: _known_parent(cfg, run_dir))
        if known is not None and status is not None:
            _guarded(lambda: known[0].set_status(known[1], status))
        raise
    if known is None:  # track_init: the parent exists now
        created = _guarded(lambda: _known_parent(cfg, run_dir))
        if created is not None:
            _guarded(lambda: open_parent(*created))


def _failed_status(exc: BaseException) -> str | None:
    """The parent's status after a job ended by ``exc``; None leaves it (a preempted segment
    is retried; ``sys.exit(0)`` is a success)."""
    if isinstance(exc, Preempted) or (isinstance(exc, SystemExit) and exc.code in (0, None)):
        return None
    return "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"


def _guarded(fn: Callable[[], T]) -> T | None:
    """``fn()``, or None with a warning if it raises."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 (status bookkeeping must not fail the job)
        log.warning("parent run status not updated: %s", error_line(exc))
        return None


def finish_parent(cfg: Config, run_dir: Path, status: str) -> str | None:
    """End the parent run of ``run_dir`` with ``status`` (rule ``track_done``, the Snakefile's
    handlers) and remove the marker; return the parent's id (None with tracking off). An
    unreachable store gets the status through the outbox; a missing, replaced or corrupt one
    is refused (:func:`.health.check_store`) before it is touched."""
    marker = RunLayout.at(run_dir).parent_open
    if not cfg.tracking.enabled:
        marker.unlink(missing_ok=True)
        return None
    check_store(cfg, Path(run_dir))
    sink = get_sink(resolve_uri(cfg), Path(run_dir))
    parent = parent_for_stage(cfg, Path(run_dir), sink)
    sink.set_status(parent, status)
    marker.unlink(missing_ok=True)
    log.info("parent run %s of %s: %s", parent, Path(run_dir).name, status)
    return parent


def is_open(run_dir: Path) -> bool:
    """True while a pipeline job has set the run's parent RUNNING and none ended it."""
    return RunLayout.at(run_dir).parent_open.is_file()
