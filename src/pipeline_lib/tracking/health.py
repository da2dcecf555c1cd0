"""Is the tracking store the one the run directory expects? Checked before a stage's work.

A stage that finds ``{run}/tracking.json`` naming a parent run in the current store must
not quietly start over in a store that lost it: MLflow would create a fresh database where
the file was moved away (or use an emptied one), the stage would compute its result, and
only then fail on the missing parent. :func:`check_store` refuses, in one
:class:`~pipeline_lib.errors.TrackingError` line naming the store and the fix, before any
work: a SQLite store that is **missing** (deleted or moved), **not a database** (or
corrupt), or **replaced**: a store answers at that place but holds no experiment of the id
tracking.json names, because the store the run used was deleted or moved and a new one was
made there since (MLflow makes a SQLite file on first open; a server's backend store
wiped). The fixes offered lose nothing: a replaced store may already hold runs made since,
so it is moved aside before the old one goes back, or the run starts over in it. A store
that still holds the experiment but lost the parent run (deleted) is repaired by
:func:`~pipeline_lib.tracking.parent.parent_for_stage`: a new parent is created and
tracking.json points at it (a warning says so). An unreachable store is not an error here:
the stage writes its outbox as always (:mod:`.sink` says so in its log line). The run
directory's own tracking files are checked first (:mod:`.run_files`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ..credentials import redact_uri
from ..errors import TrackingError
from ..spec.config import Config
from ..spec.layout import RunLayout
from .outbox import is_local_id
from .parent import read_tracking_info
from .run_files import check_tracking_files
from .sink import get_sink
from .store import StoreUnavailable, call, resolve_uri, sqlite_path

log = logging.getLogger(__name__)

SQLITE_HEADER = b"SQLite format 3\x00"


def _start_over(run_dir: Path) -> str:
    return (f"`python -m pipeline_lib track-init --run-dir {run_dir} --data DATA_DIR` and "
            f"replay outboxes with `python -m pipeline_lib sync-tracking --run-dir {run_dir}`")


def _fix(run_dir: Path) -> str:
    return f"restore the file, or re-create the store with {_start_over(run_dir)}"


def _replaced(where: Path, label: str, db: Path | None, experiment: str, name: Any,
              run_dir: Path) -> str:
    """The line for a store that answers without the experiment tracking.json names."""
    what = f"experiment {experiment}" + (f" ({name!r})" if name else "")
    if db is not None:
        return (f"tracking store {db} is not the store {where} was written against: it holds "
                f"no {what}; that store was deleted or moved, and a new one was made at "
                f"{db} since; to go back to it, move the new file aside (it may hold runs "
                f"made since) and put the old one back, or to start over in the new store "
                f"run {_start_over(run_dir)}")
    return (f"tracking store {label} holds no {what} that {where} names: the server's "
            "store was deleted or replaced since; point tracking.uri at the store that holds "
            f"it, or to start over in this one run {_start_over(run_dir)}")


def _expected_parent(info: dict[str, Any] | None, label: str) -> str | None:
    """The parent run id tracking.json says the store ``label`` holds (None: nothing
    expected there: no tracking.json, another store, or a parent still in the outbox)."""
    if not info or info.get("tracking_uri") != label:
        return None
    parent = info.get("parent_run_id")
    return parent if parent and not is_local_id(parent) else None


def check_sqlite_file(db: Path, run_dir: Path | None = None) -> None:
    """A SQLite store file that exists must be a database (its first 16 bytes)."""
    fix = _fix(run_dir) if run_dir is not None else "restore the file or point tracking.uri " \
        "at another store"
    if db.is_dir():
        raise TrackingError(f"tracking store {db} is a directory, not a SQLite file; {fix}")
    try:
        with open(db, "rb") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TrackingError(f"tracking store {db} cannot be read ({exc.strerror}); {fix}"
                            ) from None
    if head and head != SQLITE_HEADER:
        raise TrackingError(f"tracking store {db} is not a SQLite database; move it aside, "
                            f"then {fix}")


def check_store(cfg: Config, run_dir: Path) -> None:
    """Refuse a missing, replaced or corrupt store that tracking.json of ``run_dir`` relies on
    (see the module docstring); nothing when tracking is off."""
    if not cfg.tracking.enabled:
        return
    run_dir = Path(run_dir)
    check_tracking_files(run_dir)
    uri = resolve_uri(cfg)
    label = redact_uri(uri) or uri
    info = read_tracking_info(run_dir)
    parent = _expected_parent(info, label)
    where = RunLayout.at(run_dir).tracking_json
    db = sqlite_path(uri)
    if db is not None:
        check_sqlite_file(db, run_dir)
        if parent is not None and (not db.is_file() or db.stat().st_size == 0):
            state = "is missing (deleted or moved)" if not db.exists() else "is empty"
            raise TrackingError(f"tracking store {db} {state}, but {where} names parent run "
                                f"{parent} in it; {_fix(run_dir)}")
    if parent is None:
        return
    sink = get_sink(uri, run_dir)
    if not sink.online:
        return  # unreachable: the stage writes its outbox (the sink has said so)
    experiment = info.get("experiment_id") if info else None
    name = info.get("experiment_name") if info else None
    if experiment and not _holds_experiment(sink, str(experiment), name):
        raise TrackingError(_replaced(where, label, db, str(experiment), name, run_dir))


def _holds_experiment(sink: Any, experiment_id: str, name: str | None) -> bool:
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.exceptions import MlflowException

    try:
        exp = call(sink.client.get_experiment, experiment_id, what="get experiment")
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return False
        raise
    except StoreUnavailable:
        return True  # unreachable after all: the outbox takes the stage's records
    return name is None or exp.name == name
