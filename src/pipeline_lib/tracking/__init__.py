"""MLflow tracking for every stage: parent and child runs, exactly-once metrics, outbox.

Public API (mlflow is imported lazily, so importing this package is cheap):

- :func:`ensure_store` — create the store schema and experiment once (Snakemake local rule).
- :func:`init_parent_run` — find or create a ``{run}``'s parent run; writes tracking.json.
- :func:`start_stage` → :class:`StageRun` — a stage's child run (no-op when disabled).
- :func:`sync_outbox` / :func:`outbox_dirs` — replay offline outboxes into the store.
- :func:`resolve_uri` — the store URI in effect (``MLFLOW_TRACKING_URI`` over config).
"""

from .parent import init_parent_run, read_tracking_info
from .stage import StageRun, start_stage
from .store import StoreUnavailable, ensure_store, resolve_uri
from .sync import SyncReport, outbox_dirs, sync_outbox

__all__ = [
    "StageRun",
    "StoreUnavailable",
    "SyncReport",
    "ensure_store",
    "init_parent_run",
    "outbox_dirs",
    "read_tracking_info",
    "resolve_uri",
    "start_stage",
    "sync_outbox",
]
