"""Child runs of stage jobs: buffered, exactly-once metrics; params, tags, artifacts.

Usage (every stage)::

    with start_stage(cfg, run_dir, "heff_step0000300") as stage:
        stage.log_metrics(300, {"heff/loss_h1": 2.1, "heff/loss_h4": 1.9})
        stage.log_artifact(table_path, "eval")
    # leaving the block flushes and marks the run FINISHED (FAILED/KILLED on an exception)

Training keeps ONE ``train`` child across segments: pass the id it stored in the previous
snapshot (``run_id=``), store ``stage.run_id`` in the new snapshot, log every step, and call
``flush()`` only after the snapshot is durable (renamed into place). Metrics of a segment
that dies before its snapshot are discarded with the process; the retry logs those steps
again and the commit rule of :mod:`~pipeline_lib.tracking.commit` (a key's step is
committed only past the largest step stored) makes each step appear exactly once, also
when the crash fell between the snapshot rename and the commit. Call it from one process
(rank 0) per run.

With ``tracking.enabled: false`` every method is a no-op and ``run_id`` is None.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from ..spec.config import Config
from .commit import Point, check_metric_key
from .headline import Values, log_headline
from .lineage import DATA_CONTEXT, pack_dataset
from .parent import parent_for_stage
from .sink import Sink, get_sink
from .store import resolve_uri

log = logging.getLogger(__name__)

SYSTEM_METRICS_INTERVAL_S = 10.0


class StageRun:
    """One child run (see the module docstring). Not thread-safe."""

    def __init__(self, sink: Sink | None, run_id: str | None, stage: str,
                 parent_run_id: str | None = None, monitor: Any = None,
                 experiment: str = "") -> None:
        self._sink = sink
        self._experiment = experiment
        self.run_id = run_id
        self.stage = stage
        self.parent_run_id = parent_run_id
        self._monitor = monitor
        self._buffer: list[Point] = []
        self._ended = sink is None

    @property
    def enabled(self) -> bool:
        return self._sink is not None

    @property
    def offline(self) -> bool:
        """True when operations go to the outbox instead of the store."""
        return self._sink is not None and not self._sink.online

    @property
    def pending(self) -> int:
        """Buffered metric points not yet committed."""
        return len(self._buffer)

    def log_metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Buffer ``values`` at optimizer step ``step``; committed by :meth:`flush`."""
        if self._sink is None:
            return
        stamp = int(time.time() * 1000)
        for key, value in values.items():
            check_metric_key(key)
            self._buffer.append((key, float(value), int(step), stamp))

    def flush(self, through_step: int | None = None) -> int:
        """Commit buffered points (those with step ≤ ``through_step`` if given).

        Returns the number of points newly committed; points already committed (by an
        earlier attempt) are dropped, see :mod:`~pipeline_lib.tracking.commit`.
        """
        if self._sink is None or not self._buffer:
            return 0
        if through_step is None:
            todo, self._buffer = self._buffer, []
        else:
            todo = [p for p in self._buffer if p[2] <= through_step]
            self._buffer = [p for p in self._buffer if p[2] > through_step]
        return self._sink.commit_metrics(self.run_id, todo)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params now (stringified; a changed value keeps the first and warns)."""
        if self._sink is not None and params:
            self._sink.log_params(self.run_id, dict(params))

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self._sink is not None and tags:
            self._sink.set_tags(self.run_id, dict(tags))

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """Log a file, or a directory's files (e.g. the TensorBoard event directory), now (by
        path when offline: keep it until ``sync-tracking``)."""
        if self._sink is not None:
            self._sink.log_artifact(self.run_id, Path(path), artifact_path)

    def log_headline(self, group: str, values: Values, info: Mapping[str, Any] | None = None
                     ) -> int:
        """Log one version of a headline group to the parent run (:mod:`.headline`):
        ``values`` is {key: {step: value}}; returns the points newly committed."""
        if self._sink is None or self.parent_run_id is None:
            return 0
        return log_headline(self._sink, self.parent_run_id, group, values, info)

    def log_dataset(self, meta: Mapping[str, Any], data_dir: Path | str, *,
                    parent: bool = False) -> dict[str, str] | None:
        """Attach the pack (its ``metadata.json`` as ``meta``) as a dataset input of this run,
        and with ``parent`` of the parent run too; returns the dataset's fields."""
        if self._sink is None:
            return None
        dataset = pack_dataset(meta, Path(data_dir))
        targets = [self.run_id] + ([self.parent_run_id] if parent and self.parent_run_id else [])
        for run_id in targets:
            assert run_id is not None
            self._sink.log_dataset(run_id, dataset, DATA_CONTEXT)
        return dataset

    def log_model(self, run_id: str | None, spec: dict[str, Any], files: list[Path]
                  ) -> str | None:
        """Log a model of run ``run_id`` (e.g. the ``train`` run, :func:`.lineage.log_model`)."""
        if self._sink is None or run_id is None:
            return None
        return self._sink.log_model(self._experiment, run_id, spec, files)

    def end(self, status: str = "FINISHED") -> None:
        """FINISHED flushes the buffer; any other status discards it. Idempotent."""
        if self._ended:
            return
        self._ended = True
        if status == "FINISHED":
            self.flush()
        elif self._buffer:
            log.info("stage %s ended %s: %d uncommitted metric points discarded (a retry logs "
                     "them again)", self.stage, status, len(self._buffer))
            self._buffer = []
        if self._monitor is not None:
            self._monitor.finish()
        assert self._sink is not None
        self._sink.set_status(self.run_id, status)

    def __enter__(self) -> StageRun:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.end("FINISHED")
        else:
            killed = issubclass(exc_type, (KeyboardInterrupt, SystemExit))
            self.end("KILLED" if killed else "FAILED")


def start_stage(cfg: Config, run_dir: Path | str, stage: str, *, run_id: str | None = None,
                params: Mapping[str, Any] | None = None, tags: Mapping[str, Any] | None = None,
                data_id: str | None = None) -> StageRun:
    """Start (or, with ``run_id``, continue) the child run of a stage under the run's parent.

    The parent comes from ``{run_dir}/tracking.json``, and is created on first use when a
    stage runs without it (plain CLI). A ``run_id`` the store does not hold (another store,
    or deleted) is replaced by a new child run, with a warning.
    """
    if not cfg.tracking.enabled:
        return StageRun(None, None, stage)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    sink = get_sink(resolve_uri(cfg), run_dir)
    parent = parent_for_stage(cfg, run_dir, sink, data_id)
    all_tags = {"loopline.run": run_dir.name, "loopline.stage": stage, **(tags or {})}
    child = sink.continue_run(run_id) if run_id else None
    if run_id and child is None:
        log.warning("run %s is not in %s; starting a new %s run", run_id, sink.label, stage)
    if child is None:
        child = sink.create_child(cfg.experiment.name, parent, stage, all_tags)
    else:
        sink.set_tags(child, all_tags)
        sink.set_status(child, "RUNNING")
    if params:
        sink.log_params(child, dict(params))
    monitor = _system_metrics(sink, child) if cfg.tracking.system_metrics else None
    return StageRun(sink, child, stage, parent, monitor, cfg.experiment.name)


def _system_metrics(sink: Sink, run_id: str) -> Any:
    """MLflow's system-metrics monitor on the run (CPU, memory, disk, GPU when present)."""
    if not sink.online or run_id.startswith("local:"):
        log.info("system metrics are not recorded while the tracking store is unreachable")
        return None
    # mlflow (~1.2 s): the Snakefile (parent runs) and CLI --help import tracking
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, sampling_interval=SYSTEM_METRICS_INTERVAL_S,
                                   resume_logging=True, tracking_uri=sink.uri)
    monitor.start()
    return monitor
