"""The tracking store: URI resolution, one client per URI, retries, schema creation.

Only SQL-backed stores are used: ``sqlite:///path`` locally (MLflow 3 refuses the plain
file store) and ``http(s)://`` servers (themselves SQL-backed) on clusters. Relative SQLite
paths are made absolute against the current directory (Snakemake runs from the repo root),
so every process of a pipeline, whatever its working directory later, opens one file.

Failures are sorted into two kinds. *Transient* ones (connection refused, timeouts, HTTP
5xx, SQLite "database is locked") are retried with backoff and then raised as
:class:`StoreUnavailable`, which callers turn into outbox records. Everything else (a bad
metric name, a deleted experiment) is a real error and propagates.

mlflow is imported inside functions only: ``import pipeline_lib.tracking`` stays cheap.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from ..credentials import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USERNAME_ENV,
    error_line,
    redact_text,
    redact_uri,
    split_credentials,
)
from ..errors import TrackingError
from ..spec.config import Config
from .auth import auth_header, is_server, use_uri_credentials
from .run_files import tracking_io

log = logging.getLogger(__name__)

T = TypeVar("T")

# Retries on top of MLflow's own (SQLite already waits 20 s per statement: busy_timeout).
RETRY_ATTEMPTS = 4
RETRY_FIRST_DELAY_S = 0.5
PROBE_TIMEOUT_S = 3.0
# Applied with setdefault, so a user's own MLFLOW_HTTP_* settings win. MLflow's defaults
# (7 retries, backoff factor 2, 120 s timeout) let a dead server stall a stage for minutes.
# The last one keeps MLflow from writing "View run … at URL" to a stage's stdout.
HTTP_ENV_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
_AUTH_CODES = {"UNAUTHENTICATED", "PERMISSION_DENIED"}  # HTTP 401, 403
_TRANSIENT_CODES = {"TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED", "DEADLINE_EXCEEDED"}
_TRANSIENT_TEXT = ("database is locked", "failed with exception", "max retries exceeded",
                   "connection refused", "unable to open database file", "timed out")


# An experiment of this kind gets MLflow 3's model-training pages (Training runs: run list,
# chart view, models) in the UI's navigation beside its GenAI ones.
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}


class StoreUnavailable(TrackingError):
    """The store could not be reached (after retries); the caller falls back to the outbox."""


def resolve_uri(cfg: Config) -> str:
    """The store URI: ``MLFLOW_TRACKING_URI`` if set, else ``tracking.uri``; see
    :func:`store_uri`. A password in ``MLFLOW_TRACKING_URI`` is removed from it too, so
    the processes this one starts inherit the bare URI."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    uri = store_uri(env or cfg.tracking.uri)
    if env and is_server(uri) and redact_uri(env) != env:
        os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def store_uri(uri: str) -> str:
    """The URI to give MLflow: normalised, and for a server without its userinfo (moved
    into MLflow's credential variables, see :mod:`.auth`). Write it only via ``redact_uri``."""
    return use_uri_credentials(normalize_uri(uri))


def normalize_uri(uri: str) -> str:
    """Absolute SQLite paths (a query kept), no trailing slash on servers; refuse stores
    MLflow 3 refuses and server URIs its client cannot use."""
    uri = uri.strip()
    shown = redact_uri(uri)
    if uri.startswith("sqlite:"):
        path, query = _sqlite_parts(uri)
        if not uri.startswith("sqlite:///") or path in ("", ":memory:"):
            raise TrackingError(f"tracking.uri = {shown!r} is not a SQLite file; use "
                                "sqlite:///results/mlflow.db (an in-memory store is not shared)")
        return f"sqlite:///{Path(path).absolute()}{query}"
    if re.match(r"^https?://", uri):
        parts = urllib.parse.urlsplit(uri)
        if parts.query or parts.fragment:
            raise TrackingError(
                f"tracking.uri = {shown!r} has a query or fragment, which MLflow's client "
                "cannot send: it appends its API paths after them, so no request would reach "
                "the server's API; leave them out and give a token as "
                f"{TOKEN_ENV} (a bearer header), or a user and password as {USERNAME_ENV} "
                f"and {PASSWORD_ENV} or user:password@ in the URI (basic auth)")
        return parts._replace(query="", fragment="").geturl().rstrip("/?#")
    if "://" not in uri or uri.startswith("file:"):
        raise TrackingError(f"tracking.uri = {shown!r} is a plain file store, which MLflow 3 "
                            "refuses; use sqlite:///results/mlflow.db or http://host:port")
    return uri  # postgresql://, mysql://, databricks, …: passed through to MLflow


def _sqlite_parts(uri: str) -> tuple[str, str]:
    """(file path, ``?query`` or "") of a ``sqlite:///`` URI; SQLAlchemy reads the query
    as driver options, so it is no part of the file's name."""
    path, sep, query = uri[len("sqlite:///"):].partition("?")
    return path, sep + query


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(_sqlite_parts(uri)[0]) if uri.startswith("sqlite:///") else None


def probe(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the store looks reachable, else a one-line reason. Fast: no MLflow calls."""
    if is_server(uri):
        return _probe_server(uri, timeout_s)
    db = sqlite_path(uri)
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"cannot create {db.parent}: {exc.strerror}"
        if not os.access(db.parent, os.W_OK):
            return f"{db.parent} is not writable"
    return None


def health_url(uri: str) -> str:
    """The server's ``/health`` endpoint: the URI's path with ``/health`` appended (a server
    under a path prefix answers there), its query kept, no userinfo."""
    parts = urllib.parse.urlsplit(split_credentials(uri)[0])
    return parts._replace(path=parts.path.rstrip("/") + "/health", fragment="").geturl()


def _probe_server(uri: str, timeout_s: float) -> str | None:
    """GET :func:`health_url` with the credentials MLflow would send (a server behind an
    authenticating proxy may guard /health too). Reasons name the URL redacted."""
    request = urllib.request.Request(health_url(uri))
    shown = redact_uri(request.full_url)
    header = auth_header(split_credentials(uri)[1])
    if header is not None:
        request.add_header("Authorization", header)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return None if resp.status == 200 else f"{shown} answered HTTP {resp.status}"
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            given = "were refused" if header else "are needed"
            return (f"{shown} answered HTTP {exc.code}: credentials {given}; set "
                    f"{USERNAME_ENV} and {PASSWORD_ENV} (or {TOKEN_ENV})")
        return f"{shown} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return redact_text(f"{shown}: {getattr(exc, 'reason', exc)}")


def get_client(uri: str) -> Any:
    """An ``MlflowClient`` for ``uri`` (MLflow caches the underlying store per URI).

    Opening a SQLite store creates or migrates its schema right away, so the first open
    is serialised by a file lock next to the database: parallel jobs touching a new store
    at once cannot race on the migration.
    """
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException  # mlflow: as above

    if is_server(uri):
        uri = use_uri_credentials(uri)  # MLflow never sees a password in the URI
        for key, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
    db = sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    try:
        with file_lock(db.with_name(db.name + ".lock")):
            return MlflowClient(tracking_uri=uri)
    except MlflowException as exc:
        if "out-of-date database schema" in str(exc):
            raise TrackingError(f"{db} was written by an older MLflow; back it up and run "
                                f"`mlflow db upgrade sqlite:///{db}`") from None
        raise
    except Exception as exc:
        if type(exc).__name__ != "DatabaseError":  # sqlalchemy's: not a database, malformed
            raise
        reason = error_line(exc)
        raise TrackingError(f"tracking store {db} is not a usable SQLite database ({reason}); "
                            "move it aside and re-create it with `python -m pipeline_lib "
                            "track-init`, then replay outboxes with `sync-tracking`") from None


def is_transient(exc: BaseException) -> bool:
    """True for failures of reaching the store, as opposed to requests it rejects."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    code = getattr(exc, "error_code", None)
    if code in _TRANSIENT_CODES:
        return True
    name = type(exc).__name__
    text = str(exc).lower()
    if name in ("OperationalError", "ConnectionError", "Timeout", "ReadTimeout",
                "ConnectTimeout", "RequestException"):
        return True
    return name == "MlflowException" and any(t in text for t in _TRANSIENT_TEXT)


def call(fn: Callable[..., T], *args: Any, what: str = "tracking call", **kwargs: Any) -> T:
    """Run one store operation; retry transient failures with backoff, then StoreUnavailable.

    Server connection failures are not retried here (MLflow already retried them per
    ``HTTP_ENV_DEFAULTS``); SQLite lock and server 5xx errors are. Refused credentials
    (HTTP 401/403) are StoreUnavailable at once, naming the variables to set.
    """
    delay = RETRY_FIRST_DELAY_S
    for attempt in range(1, RETRY_ATTEMPTS + 1):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            code = getattr(exc, "error_code", None)
            if code in _AUTH_CODES:  # not a fault of the stage: outbox until it is fixed
                raise StoreUnavailable(f"{what}: the store refused the credentials ({code}); "
                                       f"set {USERNAME_ENV} and {PASSWORD_ENV} (or {TOKEN_ENV})"
                                       ) from exc
            if not is_transient(exc):
                raise
            text = error_line(exc, 300)
            refused = "failed with exception" in text or isinstance(exc, ConnectionError)
            if attempt == RETRY_ATTEMPTS or refused:
                raise StoreUnavailable(f"{what}: {text}") from exc
            log.debug("%s failed (%s); retry %d in %.1f s", what, text, attempt, delay)
            time.sleep(delay * (1 + 0.25 * random.random()))
            delay *= 2
    raise AssertionError("unreachable")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock across processes (``flock`` on ``path``, created if absent);
    a lock file that cannot be made is one TrackingError line."""
    with tracking_io(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # closed below, once the caller's block is done
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "experiment"


def ensure_experiment(client: Any, uri: str, name: str) -> str:
    """Id of the active experiment ``name``, created when missing (race-safe)."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.exceptions import MlflowException

    exp = call(client.get_experiment_by_name, name, what="get experiment")
    if exp is None:
        db = sqlite_path(uri)
        # SQLite: artifacts next to the database, not in ./mlruns of whoever ran first.
        location = (db.parent / "mlartifacts" / _safe_name(name)).as_uri() if db else None
        try:
            return call(client.create_experiment, name, artifact_location=location,
                        tags=EXPERIMENT_TAGS, what="create experiment")
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            exp = call(client.get_experiment_by_name, name, what="get experiment")
            assert exp is not None
    if exp.lifecycle_stage != "active":
        raise TrackingError(
            f"experiment.name = {name!r} is deleted in {redact_uri(uri)}; restore it with "
            f"`mlflow experiments restore --experiment-id {exp.experiment_id}` or rename it")
    return exp.experiment_id


def ensure_store(uri: str, experiment_name: str) -> str:
    """Create the store's schema and the experiment once; return the experiment id.

    Call it from one process before parallel jobs touch a new SQLite store (the Snakemake
    local rule ``track_init`` does): MLflow migrates an empty database on first open; the
    file lock in :func:`get_client` also makes an unsynchronised first touch safe, and a
    concurrent creation of the experiment is resolved by looking it up again. Raises
    StoreUnavailable when the store cannot be reached.
    """
    reason = probe(uri)
    if reason is not None:
        raise StoreUnavailable(reason)
    client = call(get_client, uri, what=f"open {redact_uri(uri)}")
    return ensure_experiment(client, uri, experiment_name)
