"""Headline results on a variant's parent run: the numbers a reader compares variants by.

The stages that produce them log them to the parent as groups of metrics (``heff``: the
final snapshot's H_eff sweep, ``bench``: its benchmarks, ``train``: size, tokens, wall
time). A group is *replaced*, not extended, when its numbers change (a config change
retrains, so the final snapshot and its sweep change), and the new numbers belong at the
same steps (``heff/final_loss`` at step = H_eff). The step rule of :mod:`.commit` would drop
them, so headline groups follow their own rule:

    One version of a group is its set of (key, step, value) points; all its points carry one
    timestamp, chosen when the version is first logged and recorded in the run directory
    (``tracking_files/headline.json``) *before* any point is committed. A point is committed
    unless the run already holds its (key, step, timestamp).

So a retried stage, a rerun that reproduces the same numbers and a replayed outbox add
nothing, and new numbers add one point per key and step with a newer timestamp. MLflow
keeps every version in the metric history; the run list shows, per key, the point of the
largest step and then the newest timestamp (the current version, as long as the steps stay
the same); the tag ``loopline.headline.{group}`` names the current version and its
``timestamp_ms``, which selects that version's points from the history.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from typing import Any

from ..fsio import write_text_atomic
from ..spec.layout import RunLayout
from .commit import Point, check_metric_key
from .sink import Sink
from .store import file_lock

TAG_PREFIX = "loopline.headline."

# key → {step: value}
Values = Mapping[str, Mapping[int, float]]


def _finite(values: Values) -> list[tuple[str, int, float]]:
    return sorted((key, int(step), float(value)) for key, by_step in values.items()
                  for step, value in by_step.items() if math.isfinite(float(value)))


def version_of(values: Values) -> str:
    """sha256 of a group's (key, step, value) points: equal numbers, equal version."""
    return hashlib.sha256(json.dumps(_finite(values)).encode()).hexdigest()


def version_stamp(run_dir: Any, group: str, version: str) -> int:
    """The timestamp (ms) of ``version`` of ``group``: the recorded one when the run directory
    already logged this version, else now (later than the version it replaces), recorded."""
    layout = RunLayout.at(run_dir)
    path = layout.headline_versions
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.with_name(path.name + ".lock")):
        try:
            doc = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            doc = {}
        entry = doc.get(group) or {}
        if entry.get("version") == version:
            return int(entry["timestamp_ms"])
        stamp = max(int(time.time() * 1000), int(entry.get("timestamp_ms", 0)) + 1)
        doc[group] = {"version": version, "timestamp_ms": stamp}
        write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return stamp


def log_headline(sink: Sink, parent_id: str, group: str, values: Values,
                 info: Mapping[str, Any] | None = None) -> int:
    """Log one version of ``group`` to the parent run (see the module docstring); return the
    number of points newly committed (or written to the outbox). ``info`` (e.g. the
    snapshot's step) goes into the tag ``loopline.headline.{group}``."""
    points = _finite(values)
    for key, _, _ in points:
        check_metric_key(key)
    version = version_of(values)
    stamp = version_stamp(sink.run_dir, group, version)
    todo: list[Point] = [(key, value, step, stamp) for key, step, value in points]
    done = sink.commit_versioned(parent_id, todo)
    tag = {"version": version[:16], "timestamp_ms": stamp, **(info or {})}
    sink.set_tags(parent_id, {TAG_PREFIX + group: json.dumps(tag, sort_keys=True)})
    return done
