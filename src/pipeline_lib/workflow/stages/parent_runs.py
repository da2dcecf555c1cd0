"""The variant's MLflow parent run: the store prepared once, the parent run found or created
(with the data pack as its ``pack`` child run), kept up to date with the config, closed when
the run's targets are built; and the Snakefile's onsuccess/onerror handler.

Torch-free: the Snakefile's handlers (:mod:`pipeline_lib.workflow.hooks`) import
:func:`close_open_parents` from here.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ...credentials import error_line, redact_uri
from ...errors import DataError
from ...fsio import write_text_atomic
from ...output_paths import RECORD_JSON, check_output_location
from ...spec.config import Config
from ...spec.config_write import config_hash
from ...spec.layout import RunLayout, job_benchmarks
from ...tracking import (
    StoreUnavailable,
    ensure_store,
    finish_parent,
    init_parent_run,
    read_tracking_info,
    resolve_uri,
    start_stage,
)
from ...tracking.health import check_sqlite_file
from ...tracking.store import sqlite_path
from .common import check_stage_outputs

log = logging.getLogger(__name__)


def prepare_tracking_store(cfg: Config, marker: Path) -> None:
    """Create the store's schema and the experiment once, before parallel jobs touch it.

    Writes ``marker`` (JSON: uri without credentials, experiment id or the reason it is
    unreachable); an unreachable store is not an error: stages then write their outboxes.
    """
    info: dict[str, Any] = {"enabled": cfg.tracking.enabled, "experiment": cfg.experiment.name}
    if cfg.tracking.enabled:
        uri = resolve_uri(cfg)
        info["uri"] = redact_uri(uri)
        try:
            info["experiment_id"] = ensure_store(uri, cfg.experiment.name)
        except StoreUnavailable as exc:
            log.warning("tracking store unavailable (%s); stages will log to their outboxes", exc)
            info["unavailable"] = str(exc)
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(marker, json.dumps(info, indent=2) + "\n")


def init_tracking(cfg: Config, run: str, run_dir: Path, data_dir: Path,
                  ready: Path | None = None) -> dict[str, Any]:
    """Find or create the run's parent run; log the data pack as a ``pack`` child run.

    Writes ``{run_dir}/tracking.json``, and ``ready`` last (atomically: the rule's output,
    :attr:`~pipeline_lib.spec.layout.RunLayout.tracking_ready`). The pack is shared by every
    variant with the same data config, so each variant gets its own ``pack`` child with the pack's metadata; the
    pack is a dataset input (``mlflow.data``) of that child and of the parent.
    """
    meta_path = Path(data_dir) / "metadata.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{meta_path} cannot be read ({getattr(exc, 'strerror', None) or exc}); "
                        "pass --data a packed data directory (pack it first)") from None
    check_output_location(Path(run_dir), "run directory")
    db = sqlite_path(resolve_uri(cfg)) if cfg.tracking.enabled else None
    if db is not None:
        check_sqlite_file(db)
    before = (read_tracking_info(Path(run_dir)) or {}).get("parent_run_id")
    info = init_parent_run(cfg, run, Path(run_dir), meta.get("data_id", Path(data_dir).name))
    if before and info["parent_run_id"] and info["parent_run_id"] != before:
        log.warning("the tracking store had no parent run %s of %s; it is parent run %s now "
                    "(tracking.json updated)", before, run, info["parent_run_id"])
    with start_stage(cfg, run_dir, "pack", tags={"loopline.data_dir": str(data_dir)}) as stage:
        numeric = {f"data/{k}": float(v) for k, v in meta.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        stage.log_metrics(0, numeric)
        stage.log_dataset(meta, data_dir, parent=True)
        stage.log_artifact(meta_path, "data")
        for tsv in job_benchmarks("pack_data", Path(data_dir).name):
            stage.log_artifact(tsv, "benchmarks")
    if ready is not None:  # last and whole: see RunLayout.tracking_ready
        ready.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(ready, json.dumps({"parent_run_id": info.get("parent_run_id"),
                                             "data_id": meta.get("data_id")}, indent=2) + "\n")
    return info


def update_parent(cfg: Config, run: str, run_dir: Path, data_id: str, out: Path) -> dict[str, Any]:
    """Bring the run's parent run up to date with ``cfg`` (config hash, changed params,
    config artifact: :func:`pipeline_lib.tracking.init_parent_run`); record in ``out`` the
    config hash it now carries."""
    check_stage_outputs(cfg, run_dir, [(out, RECORD_JSON)])
    info = init_parent_run(cfg, run, Path(run_dir), data_id)
    doc = {"config_hash": config_hash(cfg), "parent_run_id": info["parent_run_id"]}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(out), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def finish_run(cfg: Config, run_dir: Path, out: Path) -> dict[str, Any]:
    """Rule ``track_done``: every target of the run is built, so its parent run is FINISHED;
    ``out`` records when and which parent."""
    check_stage_outputs(cfg, run_dir, [(out, RECORD_JSON)])
    parent = finish_parent(cfg, Path(run_dir), "FINISHED")
    doc = {"parent_run_id": parent, "status": "FINISHED",
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(out), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def close_open_parents(plan: Any, status: str) -> list[str]:
    """The Snakefile's onsuccess (FINISHED) and onerror (FAILED) handler: end the parent run
    of every run whose pipeline stages opened it and no ``track_done`` closed (a run of only
    some targets, a failed or killed stage). Best effort: a failure is a warning. Returns
    the runs closed; costs a file check per run when none is open."""
    closed = []
    for name, run_plan in plan.runs.items():
        run_dir = plan.layout.run(name).run_dir
        if not RunLayout.at(run_dir).parent_open.is_file():
            continue
        try:
            finish_parent(run_plan.config, run_dir, status)
            closed.append(name)
        except Exception as exc:  # noqa: BLE001 (a handler must not mask the run's outcome)
            log.warning("could not set the parent run of %s to %s: %s", name, status,
                        error_line(exc))
    return closed
