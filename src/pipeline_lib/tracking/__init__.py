"""MLflow tracking for every stage: parent and child runs, exactly-once metrics, outbox.

Public API (mlflow is imported lazily, so importing this package is cheap):

- :func:`ensure_store` — create the store schema and experiment once (Snakemake local rule).
- :func:`init_parent_run` — find or create a ``{run}``'s parent run; writes tracking.json.
- :func:`start_stage` → :class:`StageRun` — a stage's child run (no-op when disabled).
- :func:`sync_outbox` / :func:`outbox_dirs` — replay offline outboxes into the store.
- :func:`resolve_uri` — the store URI in effect (``MLFLOW_TRACKING_URI`` over config).
- :func:`pipeline_job` / :func:`finish_parent` — the parent run's status follows its
  pipeline's jobs (:mod:`.lifecycle`); headline results, dataset inputs and logged models go through
  :class:`StageRun` (:mod:`.headline`, :mod:`.lineage`).
"""

from .lifecycle import finish_parent, is_open, pipeline_job
from .parent import init_parent_run, read_tracking_info
from .stage import StageRun, start_stage
from .store import StoreUnavailable, ensure_store, resolve_uri
from .sync import SyncReport, outbox_dirs, sync_outbox

__all__ = [
    "StageRun",
    "StoreUnavailable",
    "SyncReport",
    "ensure_store",
    "finish_parent",
    "init_parent_run",
    "is_open",
    "pipeline_job",
    "outbox_dirs",
    "read_tracking_info",
    "resolve_uri",
    "start_stage",
    "sync_outbox",
]
