"""Finding and creating loopline's runs in a store (used online and by outbox replay).

The run model: one parent run per ``{run}`` directory, found by the tags
``loopline.role = parent`` and ``loopline.run = {run}`` in the experiment, so creating it
is idempotent; one child run per stage job, tagged ``mlflow.parentRunId`` (the parent
link MLflow's UI nests by) and ``loopline.key`` (a unique key chosen by the process that
created it, so a replayed or retried creation finds the run instead of duplicating it).
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import TrackingError
from .commit import clean_tags
from .store import call

ROLE_TAG = "loopline.role"
RUN_TAG = "loopline.run"
KEY_TAG = "loopline.key"
STAGE_TAG = "loopline.stage"
DATA_ID_TAG = "loopline.data_id"
SUPERSEDED_TAG = "loopline.superseded"
PARENT_TAG = "mlflow.parentRunId"


def _quoted(value: str) -> str:
    if "'" in value:
        raise TrackingError(f"run name {value!r} contains a quote; use an identifier")
    return f"'{value}'"


def _first(client: Any, experiment_id: str, filter_string: str) -> str | None:
    found = call(client.search_runs, [experiment_id], filter_string=filter_string,
                 max_results=1, order_by=["attributes.start_time ASC"], what="search runs")
    return found[0].info.run_id if found else None


def find_parent(client: Any, experiment_id: str, run: str) -> str | None:
    """The oldest active parent run of ``run`` in the experiment, if any."""
    return _first(client, experiment_id,
                  f"tags.`{ROLE_TAG}` = 'parent' and tags.`{RUN_TAG}` = {_quoted(run)}")


def find_or_create_parent(client: Any, experiment_id: str, run: str,
                          tags: dict[str, Any], start_ms: int | None = None) -> str:
    """The parent run of ``run`` (tags refreshed), created if missing (at ``start_ms``: an
    outbox replay creates it at the time it was first made offline).

    Callers serialise on a file lock in the run directory; two stores racing remain
    possible only without it, and then the oldest parent is the one found later.
    """
    run_id = find_parent(client, experiment_id, run)
    merged = clean_tags({**tags, ROLE_TAG: "parent", RUN_TAG: run, SUPERSEDED_TAG: "false"})
    if run_id is None:
        # A stage that does not know the pack (e.g. an eval from a copied run directory)
        # never overwrites a known data_id; a new parent says it is unknown.
        merged.setdefault(DATA_ID_TAG, "unknown")
        created = call(client.create_run, experiment_id, tags=merged, run_name=run,
                       start_time=start_ms, what="create parent run")
        run_id = created.info.run_id
        # Finished until a pipeline's stage starts (see .lifecycle): a parent made by a
        # stage run alone would otherwise be shown running for ever.
        call(client.set_terminated, run_id, "FINISHED", end_time=created.info.start_time,
             what="end parent run")
    else:
        # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
        from mlflow.entities import RunTag

        items = [RunTag(k, v) for k, v in merged.items()]
        for i in range(0, len(items), 100):
            call(client.log_batch, run_id, tags=items[i : i + 100], what="set parent tags")
    return run_id


def find_by_key(client: Any, experiment_id: str, key: str) -> str | None:
    return _first(client, experiment_id, f"tags.`{KEY_TAG}` = {_quoted(key)}")


def find_or_create_child(client: Any, experiment_id: str, key: str, parent_id: str,
                         run_name: str, tags: dict[str, Any],
                         start_ms: int | None = None) -> str:
    """The child run with ``loopline.key = key``, created under ``parent_id`` if missing."""
    run_id = find_by_key(client, experiment_id, key)
    if run_id is not None:
        return run_id
    merged = clean_tags({**tags, KEY_TAG: key, PARENT_TAG: parent_id, SUPERSEDED_TAG: "false"})
    created = call(client.create_run, experiment_id, tags=merged, run_name=run_name,
                   start_time=start_ms, what="create stage run")
    if merged.get(STAGE_TAG):
        supersede_siblings(client, experiment_id, parent_id, merged[STAGE_TAG],
                           created.info.run_id)
    return created.info.run_id


def supersede_siblings(client: Any, experiment_id: str, parent_id: str, stage: str,
                       current: str) -> list[str]:
    """Tag every other child of ``parent_id`` for ``stage`` ``loopline.superseded = true``:
    a rerun of a stage (a retrain after a config change, a retried first segment, a sweep
    rerun) makes the new run the current one. Returns the ids tagged."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import RunTag

    found = call(client.search_runs, [experiment_id],
                 filter_string=f"tags.`{PARENT_TAG}` = {_quoted(parent_id)} and "
                               f"tags.`{STAGE_TAG}` = {_quoted(stage)}",
                 max_results=1000, what="search sibling runs")
    tagged = [r.info.run_id for r in found if r.info.run_id != current
              and r.data.tags.get(SUPERSEDED_TAG) != "true"]
    for run_id in tagged:
        call(client.log_batch, run_id, tags=[RunTag(SUPERSEDED_TAG, "true")],
             what="tag superseded run")
    return tagged


def run_exists(client: Any, run_id: str) -> bool:
    """True if the store holds an active run with this id."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.exceptions import MlflowException

    try:
        run = call(client.get_run, run_id, what="get run")
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return False
        raise
    return run.info.lifecycle_stage == "active"


def set_status(client: Any, run_id: str, status: str, time_ms: int | None = None) -> None:
    """Set a run's status and its end time to ``time_ms`` (default now). RUNNING reopens a
    run (a continued training run, a parent whose pipeline runs again): its end time then
    marks the latest (re)start, so the duration shown covers the run so far."""
    what = "reopen run" if status == "RUNNING" else "end run"
    call(client.set_terminated, run_id, status, end_time=time_ms or int(time.time() * 1000),
         what=what)
