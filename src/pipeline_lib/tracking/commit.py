"""Exactly-once metric commits and MLflow-safe params and tags.

The rule (what makes a retried segment, a retried commit and a replayed outbox safe):

    Per run and metric key, steps are committed in increasing order. A point is committed
    only if its step is greater than the largest step the run already holds for that key.

The largest stored step per key comes from the run's *latest metrics* (``get_run``), which
MLflow updates in the same database transaction as the metric rows, so it can never lag
behind what was committed, whatever moment a process dies at. Consequences: one value per
key and step (the first committed wins; within one buffer the last logged wins); a key's
steps must be logged in increasing order (a later point at a smaller step is dropped).

Params are immutable in MLflow: :func:`log_params_once` logs only new keys, skips keys
whose value is unchanged, and for changed values keeps the first value, sets the tag
``loopline.params_changed`` (the changed keys) and a tag ``loopline.param.{key}`` with each
one's current value, and warns, instead of failing the stage.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import TrackingError
from ..spec.names import is_name
from .store import call

log = logging.getLogger(__name__)

MAX_METRICS_PER_BATCH = 1000  # mlflow.utils.validation limits
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_PARAM_VAL_LENGTH = 6000
MAX_TAG_VAL_LENGTH = 8000
MAX_KEY_LENGTH = 250
CHANGED_TAG = "loopline.params_changed"
CURRENT_PARAM_TAG = "loopline.param."  # + key: the current value of a changed param
_NAME_RE = re.compile(r"^[A-Za-z0-9_\-. /:]+$")

# A metric point: (key, value, step, timestamp in ms).
Point = tuple[str, float, int, int]


def check_metric_key(key: str) -> None:
    """Refuse names MLflow would reject, at log time rather than at commit time."""
    if not key or len(key) > MAX_KEY_LENGTH or not is_name(key, _NAME_RE) \
            or posixpath.normpath(key) != key or key.startswith("/"):
        raise TrackingError(f"metric name {key!r} is not allowed by MLflow; use letters, digits, "
                            "and _ - . / : or spaces, at most 250 characters")


def stringify(value: Any, limit: int) -> str:
    """A param/tag value as text: JSON for containers; cut to ``limit`` characters."""
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, sort_keys=True, default=str)
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clean_params(params: Mapping[str, Any]) -> dict[str, str]:
    return {str(k)[:MAX_KEY_LENGTH]: stringify(v, MAX_PARAM_VAL_LENGTH) for k, v in params.items()}


def clean_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    return {str(k)[:MAX_KEY_LENGTH]: stringify(v, MAX_TAG_VAL_LENGTH) for k, v in tags.items()}


def latest_steps(client: Any, run_id: str) -> dict[str, int]:
    """Largest committed step per metric key of a run (MLflow's latest-metrics table)."""
    run = call(client.get_run, run_id, what="get run")
    # RunData keeps the Metric objects (with steps) privately; MLflow's own system-metrics
    # resume reads them the same way instead of paging the whole history.
    return {m.key: int(m.step) for m in run.data._metric_objs}


def select_new(points: Iterable[Point], committed: Mapping[str, int]) -> list[Point]:
    """Points past each key's committed step, one per (key, step) (last wins), step-sorted."""
    latest: dict[tuple[str, int], Point] = {}
    for point in points:
        key, _, step, _ = point
        if step > committed.get(key, -(2**62)):
            latest[(key, step)] = point
    return sorted(latest.values(), key=lambda p: (p[2], p[0]))


def chunks(points: Sequence[Point], size: int = MAX_METRICS_PER_BATCH) -> list[Sequence[Point]]:
    return [points[i : i + size] for i in range(0, len(points), size)]


def commit_points(client: Any, run_id: str, points: Iterable[Point],
                  committed: dict[str, int] | None = None) -> int:
    """Commit the new points with ``log_batch`` (≤ 1000 per call); return how many.

    ``committed`` is the caller's cache of :func:`latest_steps` (read once per run and
    updated here after every batch); None reads it from the store.
    """
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import Metric

    if committed is None:
        committed = latest_steps(client, run_id)
    todo = select_new(points, committed)
    for batch in chunks(todo):
        metrics = [Metric(k, float(v), ts, s) for k, v, s, ts in batch]
        call(client.log_batch, run_id, metrics=metrics, what="log metrics")
        for key, _, step, _ in batch:
            committed[key] = max(step, committed.get(key, step))
    return len(todo)


def commit_versioned(client: Any, run_id: str, points: Iterable[Point],
                     known: dict[str, set[tuple[int, int]]] | None = None) -> int:
    """Commit the points whose (key, step, timestamp) the run does not hold yet; return how many.

    The rule for results that are replaced rather than extended (the parent's headline
    metrics, :mod:`.headline`): one version of them is a set of points sharing one
    timestamp, so a later version is logged at the same steps again and a retried or
    replayed commit of one version adds nothing. ``known`` caches each key's stored
    (step, timestamp) pairs (read from the metric history on first use, updated here).
    """
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import Metric

    known = {} if known is None else known
    todo: dict[tuple[str, int, int], Point] = {}
    for point in points:
        key, _, step, stamp = point
        if key not in known:
            history = call(client.get_metric_history, run_id, key, what="get metric history")
            known[key] = {(int(m.step), int(m.timestamp)) for m in history}
        if (step, stamp) not in known[key]:
            todo[(key, step, stamp)] = point
    batch_points = sorted(todo.values(), key=lambda p: (p[3], p[2], p[0]))
    for batch in chunks(batch_points):
        metrics = [Metric(k, float(v), ts, s) for k, v, s, ts in batch]
        call(client.log_batch, run_id, metrics=metrics, what="log metrics")
        for key, _, step, stamp in batch:
            known[key].add((step, stamp))
    return len(batch_points)


def log_params_once(client: Any, run_id: str, params: Mapping[str, Any]) -> list[str]:
    """Log params that the run lacks; return the keys whose stored value differs.

    Changed keys keep their first value (MLflow params are immutable); they are listed in
    the tag ``loopline.params_changed`` and in one warning, and each one's current value is
    the tag ``loopline.param.{key}``. When nothing differs any more, the list is emptied.
    """
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import Param

    wanted = clean_params(params)
    if not wanted:
        return []
    data = call(client.get_run, run_id, what="get run").data
    existing = data.params
    new = [Param(k, v) for k, v in wanted.items() if k not in existing]
    changed = sorted(k for k, v in wanted.items() if k in existing and existing[k] != v)
    for i in range(0, len(new), MAX_PARAMS_TAGS_PER_BATCH):
        call(client.log_batch, run_id, params=new[i : i + MAX_PARAMS_TAGS_PER_BATCH],
             what="log params")
    if changed:
        log.warning("run %s: params %s changed since they were first logged; MLflow keeps the "
                    "first values (tag %s lists them, %s<key> holds each current value)",
                    run_id, ", ".join(changed[:10]), CHANGED_TAG, CURRENT_PARAM_TAG)
    if changed or data.tags.get(CHANGED_TAG):
        current = {CURRENT_PARAM_TAG + k: wanted[k] for k in changed}
        # back at a first value: the key's current-value tag says so
        current.update({k: existing[k[len(CURRENT_PARAM_TAG):]] for k in data.tags
                        if k.startswith(CURRENT_PARAM_TAG) and k not in current
                        and k[len(CURRENT_PARAM_TAG):] in existing})
        set_tags(client, run_id, {CHANGED_TAG: ",".join(changed), **current})
    return changed


def set_tags(client: Any, run_id: str, tags: Mapping[str, Any]) -> None:
    """Set tags (mutable in MLflow) in batches of 100."""
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.entities import RunTag

    items = [RunTag(k, v) for k, v in clean_tags(tags).items()]
    for i in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
        call(client.log_batch, run_id, tags=items[i : i + MAX_PARAMS_TAGS_PER_BATCH],
             what="set tags")
