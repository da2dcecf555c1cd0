"""The parent run of a ``{run}`` directory and its ``tracking.json``.

``{results}/{run}/tracking.json`` holds ``tracking_uri`` (without credentials),
``experiment_id``, ``experiment_name`` and ``parent_run_id`` (plus ``enabled``). It is written only when its
content changes, because Snakemake compares modification times: rewriting an identical
file would make every downstream job look stale.

Params of the parent are the flattened resolved config. MLflow params are immutable, so
when a run directory's config changes later, the parent keeps the first values; the tag
``loopline.config_hash`` moves to the new hash, ``loopline.params_changed`` lists the keys
that differ (with a warning), and every version's resolved config is kept as the artifact
``config/config_<hash>.yaml``. The parent run is found again by its tags, never created
twice (a file lock in the run directory serialises concurrent first uses).
"""

from __future__ import annotations

import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

from ..fsio import write_text_atomic
from ..provenance import git_output, package_version
from ..spec.config import Config
from ..spec.config_load import PROJECT_ROOT
from ..spec.config_write import config_hash, flatten, public_dict, save_config
from ..spec.layout import RunLayout
from .run_files import check_tracking_files, tracking_io
from .runs import DATA_ID_TAG
from .sink import Sink, get_sink
from .store import file_lock, resolve_uri

log = logging.getLogger(__name__)


def read_tracking_info(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's tracking.json, or None if absent or not JSON (a folder there or
    a file that cannot be read: one TrackingError line, :func:`.run_files.tracking_io`)."""
    path = RunLayout.at(run_dir).tracking_json
    if not os.path.lexists(path):
        return None
    try:
        with tracking_io(path):
            return json.loads(path.read_text())
    except ValueError:
        log.warning("%s is not valid JSON; the parent run will be looked up again", path)
        return None


def write_tracking_info(run_dir: Path, info: dict[str, Any]) -> None:
    """Write tracking.json atomically, and only if its content differs."""
    path = RunLayout.at(run_dir).tracking_json
    with tracking_io(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(info, indent=2, sort_keys=True) + "\n",
                          if_changed=True)


def git_state(root: Path = PROJECT_ROOT) -> tuple[str, str]:
    """(commit, dirty) of the project checkout; ("unknown", "unknown") without git."""
    commit = git_output(root, "rev-parse", "HEAD") or "unknown"
    status = git_output(root, "status", "--porcelain", "--untracked-files=no")
    dirty = "unknown" if status is None else ("true" if status else "false")
    return commit, dirty


def provenance_tags(cfg: Config, run: str, data_id: str | None) -> dict[str, str]:
    """Tags of a parent run: code, config and data identity, software versions."""
    commit, dirty = git_state()
    tags = {
        "loopline.config_hash": config_hash(cfg),
        "loopline.git_commit": commit,
        "loopline.git_dirty": dirty,
        "loopline.version.snakemake": package_version("snakemake", "absent"),
        "loopline.version.torch": package_version("torch", "absent"),
        "loopline.version.mlflow": package_version("mlflow", "absent"),
        "loopline.version.python": platform.python_version(),
    }
    if commit != "unknown":
        tags["mlflow.source.git.commit"] = commit
    if data_id:  # absent rather than "unknown": never overwrite the tag a packing stage set
        tags[DATA_ID_TAG] = data_id
    return tags


def init_parent_run(cfg: Config, run: str, run_dir: Path, data_id: str | None) -> dict[str, Any]:
    """Find or create the parent run of ``run``; write and return tracking.json's content.

    Idempotent. ``cfg`` is the run's resolved config (:func:`~pipeline_lib.workflow.resolve.
    resolve_run`'s: its variant applied, ``runs`` empty). With tracking disabled nothing is contacted and
    tracking.json records ``enabled: false``. An unreachable store yields a local parent
    id, kept in the outbox until ``sync-tracking`` replays it.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_tracking_files(run_dir)
    if not cfg.tracking.enabled:
        info = {"enabled": False, "tracking_uri": None, "experiment_id": None,
                "experiment_name": cfg.experiment.name, "parent_run_id": None}
        write_tracking_info(run_dir, info)
        return info
    uri = resolve_uri(cfg)
    with file_lock(RunLayout.at(run_dir).tracking_lock):
        info = _find_or_create(cfg, run, run_dir, data_id, get_sink(uri, run_dir))
        write_tracking_info(run_dir, info)
    return info


def _find_or_create(cfg: Config, run: str, run_dir: Path, data_id: str | None,
                    sink: Sink) -> dict[str, Any]:
    name = cfg.experiment.name
    experiment_id = sink.experiment_id(name)
    known = read_tracking_info(run_dir) or {}
    earlier = known.get("parent_run_id") if known.get("tracking_uri") == sink.label else None
    parent = sink.create_parent(name, run, provenance_tags(cfg, run, data_id), earlier)
    sink.log_params(parent, flatten(public_dict(cfg)))
    # each resolved config, logged as a parent-run artifact
    config_file = RunLayout.at(run_dir).tracking_files / f"config_{config_hash(cfg)}.yaml"
    if not config_file.is_file():
        config_file.parent.mkdir(parents=True, exist_ok=True)
        save_config(cfg, config_file)
    sink.log_artifact(parent, config_file, "config")
    return {"enabled": True, "tracking_uri": sink.label, "experiment_id": experiment_id,
            "experiment_name": name, "parent_run_id": parent}


def _still_there(sink: Sink, run_id: str) -> bool:
    """False only when the store answers and holds no active run ``run_id`` (an outbox id
    or an unreachable store: the outbox keeps the stage's records, as always)."""
    return sink.continue_run(run_id) is not None


def parent_for_stage(cfg: Config, run_dir: Path, sink: Sink,
                     data_id: str | None = None) -> str:
    """The parent run id a stage of ``run_dir`` attaches to (created on first use).

    tracking.json is trusted when it names the current store; otherwise (absent, written
    with tracking disabled, or for another store) the parent is found (and left as it is)
    or created in the current store, and tracking.json is written only if it did not exist.
    """
    info = read_tracking_info(run_dir)
    if info and info.get("parent_run_id") and info.get("tracking_uri") == sink.label:
        known = sink.resolve(info["parent_run_id"])
        if _still_there(sink, known):
            return known
    run = Path(run_dir).name
    with file_lock(RunLayout.at(run_dir).tracking_lock):
        info = read_tracking_info(run_dir)  # another process may have written it meanwhile
        lost = None
        if info and info.get("parent_run_id") and info.get("tracking_uri") == sink.label:
            known = sink.resolve(info["parent_run_id"])
            if _still_there(sink, known):
                return known
            lost = known
        if lost is not None:  # the store lost the parent (deleted): a new one, recorded
            fresh = _find_or_create(cfg, run, Path(run_dir), data_id, sink)
            write_tracking_info(run_dir, fresh)
            log.warning("parent run %s of %s is not in %s (deleted?); created parent run %s "
                        "and updated %s", lost, run, sink.label, fresh["parent_run_id"],
                        RunLayout.at(run_dir).tracking_json)
            return fresh["parent_run_id"]
        # tracking.json for another store (a copied or moved run directory): attach to the
        # parent found there as it is; its params and config are track_config's to update,
        # and a stage's resolved config (vocab size filled in) would look like a change.
        found = sink.find_parent(cfg.experiment.name, run) if info else None
        if found is not None:
            if data_id:
                sink.set_tags(found, {DATA_ID_TAG: data_id})
            return found
        fresh = _find_or_create(cfg, run, Path(run_dir), data_id, sink)
        if info is None:
            write_tracking_info(run_dir, fresh)
    return fresh["parent_run_id"]
