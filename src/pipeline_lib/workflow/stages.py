"""One function per Snakemake rule that is more than a single library call: each runs its
stage and reports it to MLflow as a child run of the variant's parent run.

The Snakemake scripts (workflow/scripts) and the CLI call these, so a stage behaves the
same inside and outside the workflow. Tracking never decides success: an unreachable store
sends everything to the run's outbox (see :mod:`pipeline_lib.tracking`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..fsio import write_text_atomic
from ..output_paths import BENCH_JSON, FIGURE, HEFF_JSON, RECORD_JSON, TABLE
from ..output_set import output_set
from ..spec.config import Config
from ..spec.layout import RunLayout, job_benchmarks
from .final_results import bench_values, heff_values, is_final

log = logging.getLogger(__name__)


def _step_name(step: int | None) -> str:
    return "final" if step is None else f"step_{step:07d}"


def check_stage_outputs(cfg: Config, run_dir: Path, files: Sequence[tuple[Path | None, Any]] = (),
                        inputs: Sequence[tuple[str, Path]] = ()) -> None:
    """Before a stage's work: every output file (path, :class:`~pipeline_lib.output_paths.
    OutputKind`) passes the output rule against the stage's ``inputs``
    (:func:`pipeline_lib.output_paths.check_outputs`), and with tracking on the run
    directory can take tracking.json and the outbox and the store is the one tracking.json
    expects (:func:`pipeline_lib.tracking.health.check_store`). One line each, nothing
    written."""
    from ..output_paths import Output, check_output_location, check_outputs

    check_outputs([Output(Path(path), "output", kind) for path, kind in files
                   if path is not None], [(what, Path(p)) for what, p in inputs])
    if cfg.tracking.enabled:
        from ..tracking.health import check_store

        check_output_location(Path(run_dir), "run directory (tracking)")
        check_store(cfg, Path(run_dir))


def prepare_tracking_store(cfg: Config, marker: Path) -> None:
    """Create the store's schema and the experiment once, before parallel jobs touch it.

    Writes ``marker`` (JSON: uri without credentials, experiment id or the reason it is
    unreachable); an unreachable store is not an error: stages then write their outboxes.
    """
    from ..credentials import redact_uri
    from ..tracking import StoreUnavailable, ensure_store, resolve_uri

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
    :attr:`~pipeline_lib.spec.layout.RunLayout.tracking_ready`). The pack is shared by every variant with the same
    data config, so each variant gets its own ``pack`` child with the pack's metadata; the
    pack is a dataset input (``mlflow.data``) of that child and of the parent.
    """
    from ..errors import DataError
    from ..output_paths import check_output_location
    from ..tracking import init_parent_run, read_tracking_info, resolve_uri, start_stage
    from ..tracking.health import check_sqlite_file
    from ..tracking.store import sqlite_path

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
    from ..spec.config import config_hash
    from ..tracking import init_parent_run

    check_stage_outputs(cfg, run_dir, [(out, RECORD_JSON)])
    info = init_parent_run(cfg, run, Path(run_dir), data_id)
    doc = {"config_hash": config_hash(cfg), "parent_run_id": info["parent_run_id"]}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(Path(out), json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def _kernel_tags() -> dict[str, str]:
    """The kernels the stage's model ran (a FlexAttention or grouped GEMM fallback)."""
    from ..model.kernels import kernel_tags

    return kernel_tags()


def heff_stage(cfg: Config, run_dir: Path, snapshot: Path, data_dir: Path,
               out: Path) -> dict[str, Any]:
    """H_eff sweep of one snapshot (``eval.*`` settings) as child run ``eval_heff/step_…``,
    on ``experiment.device`` in ``experiment.precision``; the final snapshot's sweep also
    goes to the parent run (``heff/final_loss`` at step = H_eff, see :mod:`.final_results`)."""
    from ..evaluate.exit.spec import ExitSpec
    from ..evaluate.heff import parse_h_eff, run_heff
    from ..tracking import start_stage

    h_effs = parse_h_eff(cfg.eval.h_eff, "eval.h_eff")
    check_stage_outputs(cfg, run_dir, [(out, HEFF_JSON)],
                        [("--snapshot", snapshot), ("--data", data_dir)])
    with output_set() as outputs:
        result = run_heff(Path(snapshot), Path(data_dir), h_effs, outputs.file(out),
                          max_tokens=cfg.eval.max_tokens, batch_rows=cfg.eval.batch_rows,
                          use_ema=cfg.eval.use_ema,
                          adaptive=ExitSpec.from_config(cfg.eval.adaptive),
                          device=cfg.experiment.device, precision=cfg.experiment.precision,
                          objective=cfg.train.objective)
    step = result["step"]
    with start_stage(cfg, run_dir, f"eval_heff/{_step_name(step)}",
                     params={"eval.h_eff": h_effs, "eval.max_tokens": cfg.eval.max_tokens,
                             "eval.use_ema": cfg.eval.use_ema, "device": result["device"],
                             "precision": result["precision"]}, tags=_kernel_tags()) as stage:
        metrics = {f"heff/loss_h{h}": v for h, v in result["losses"].items()}
        metrics["heff/best_h"] = result["best_h_eff"]
        metrics["heff/deeper_better"] = float(result["deeper_better"])
        for i, section in enumerate(result.get("adaptive_by_criterion", {}).values()):
            name = "adaptive" if i == 0 else f"adaptive_{section['criterion']}"  # first: as before
            for point in section["points"]:
                metrics[f"heff/{name}_loss_t{point['threshold']:g}"] = point["loss"]
                metrics[f"heff/{name}_loops_t{point['threshold']:g}"] = point["mean_loops"]
        stage.log_metrics(step or 0, metrics)
        stage.log_artifact(out, "eval/heff")
        if is_final(Path(snapshot)):
            stage.log_headline("heff", heff_values(result), {"step": step})
    return result


def summarize_heff_stage(cfg: Config, run: str, run_dir: Path, inputs: Sequence[Path],
                         table: Path, plot: Path, adaptive_table: Path | None = None,
                         adaptive_plot: Path | None = None, *,
                         title: str | None = None) -> dict[Path, int]:
    """Parquet table + figure over every kept snapshot's sweep (and of their adaptive-exit
    sections, when those paths are given), logged as ``eval_summary``. Returns the rows
    written per table; ``title`` (default: named after ``run``) heads both figures."""
    from ..evaluate.heff_summary import summarize_heff
    from ..tracking import start_stage

    check_stage_outputs(cfg, run_dir, [(table, TABLE), (plot, FIGURE), (adaptive_table, TABLE),
                                       (adaptive_plot, FIGURE)],
                        [("--inputs", path) for path in inputs])
    extra: list[Path] = []
    with output_set() as outputs:  # the tables and figures appear together or not at all
        rows = {Path(table): len(summarize_heff(
            list(inputs), outputs.file(table), outputs.file(plot),
            title=f"{run}: validation loss vs H_eff" if title is None else title))}
        if adaptive_table is not None and adaptive_plot is not None:
            from ..evaluate.exit.summary import summarize_adaptive

            extra = [Path(adaptive_table), Path(adaptive_plot)]
            rows[extra[0]] = len(summarize_adaptive(
                list(inputs), outputs.file(extra[0]), outputs.file(extra[1]),
                title=f"{run}: adaptive exit vs fixed H_eff" if title is None else title))
    with start_stage(cfg, run_dir, "eval_summary") as stage:
        stage.log_artifact(table, "eval")
        stage.log_artifact(plot, "eval")
        for path in extra:
            stage.log_artifact(path, "eval")
        layout = RunLayout.at(run_dir)
        for tsv in layout.benchmarks("eval_heff") + layout.benchmarks("train_segment"):
            stage.log_artifact(tsv, "benchmarks")
    return rows


def bench_stage(cfg: Config, run_dir: Path, snapshot: Path, out: Path,
                tasks_dir: Path) -> dict[str, Any]:
    """Downstream benchmarks of one snapshot at every ``bench.h_eff`` (and adaptive exit),
    as child run ``bench/step_…`` with metrics ``bench/{task}/{metric}_h{h}`` (adaptive:
    ``…_adaptive:T:MAX`` with ``mean_loops_…`` and ``loops_hist_…/{loops}``, see
    :func:`pipeline_lib.bench.scoring.bench_metrics`) at the snapshot's step; the final
    snapshot's fixed-H_eff scores also go to the parent run (``bench/{task}/{metric}`` at
    step = H_eff, with their intervals)."""
    from ..bench import run_benchmarks
    from ..bench.scoring import bench_metrics
    from ..bench.tasks import check_tasks_dir
    from ..checkpoint.manifest import verify_snapshot
    from ..tracking import start_stage

    check_stage_outputs(cfg, run_dir, [(out, BENCH_JSON)], [("--snapshot", snapshot)])
    check_tasks_dir(Path(tasks_dir))
    verify_snapshot(Path(snapshot), hash_files=())  # before the task files are written
    with output_set() as outputs:
        result = run_benchmarks(Path(snapshot), cfg.bench, Path(tasks_dir), outputs.file(out),
                                device=cfg.experiment.device,
                                precision=cfg.experiment.precision)
    step = result.get("step")
    with start_stage(cfg, run_dir, f"bench/{_step_name(step)}",
                     params={"bench.tasks": cfg.bench.tasks, "bench.h_eff": cfg.bench.h_eff,
                             **_adaptive_params(cfg.bench)},
                     tags=_kernel_tags()) as stage:
        stage.log_metrics(step or 0, bench_metrics(result))
        stage.log_artifact(out, "bench")
        if is_final(Path(snapshot)):
            stage.log_headline("bench", bench_values(result), {"step": step})
    return result


def _adaptive_params(bench: Any) -> dict[str, Any]:
    """The bench stage's adaptive-exit params; none when it is off."""
    adaptive = bench.adaptive
    if not adaptive.thresholds:
        return {}
    return {"bench.adaptive.criteria": adaptive.criteria,
            "bench.adaptive.thresholds": adaptive.thresholds,
            "bench.adaptive.criterion_thresholds": adaptive.criterion_thresholds,
            "bench.adaptive.max_loops": adaptive.max_loops}


def summarize_bench_stage(cfg: Config, run: str, run_dir: Path, inputs: Sequence[Path],
                          table: Path, plot: Path) -> dict[Path, int]:
    """Long table + accuracy heatmaps over the benchmarked snapshots (``bench_summary``).
    Returns the rows written per table."""
    from ..bench import summarize_bench
    from ..tracking import start_stage

    check_stage_outputs(cfg, run_dir, [(table, TABLE), (plot, FIGURE)],
                        [("--inputs", path) for path in inputs])
    with output_set() as outputs:  # the table and the figure appear together or not at all
        rows = {Path(table): len(summarize_bench([Path(p) for p in inputs],
                                                 outputs.file(table), outputs.file(plot)))}
    with start_stage(cfg, run_dir, "bench_summary") as stage:
        stage.log_artifact(table, "bench")
        stage.log_artifact(plot, "bench")
        for tsv in RunLayout.at(run_dir).benchmarks("bench_downstream"):
            stage.log_artifact(tsv, "benchmarks")
    return rows


def import_stage(cfg: Config, run_dir: Path, out: Path) -> dict[str, Any]:
    """Rule ``import_init``: ``model.init_from`` imported as a snapshot at ``out`` (child run
    ``import``: source, layers, fingerprint as params, import time and size as metrics, the
    import record as an artifact)."""
    from ..export.hf_import import IMPORT_RECORD, import_checkpoint, init_layers
    from ..tracking import start_stage

    check_stage_outputs(cfg, run_dir)
    init = cfg.model.init_from
    _, choice = init_layers(cfg)
    record = import_checkpoint(init.source, out, cfg, choice, adapter=init.adapter)
    params = {"import.source": record["source"]["source"],
              "import.fingerprint": record["fingerprint"],
              "import.architecture": record["architecture"],
              **{f"import.{part}": str(value) for part, value in record["layers"].items()}}
    with start_stage(cfg, run_dir, "import", params=params) as stage:
        stage.log_metrics(0, {"import/seconds": record["seconds"],
                              "import/parameters": float(record["parameters"])})
        stage.log_artifact(Path(out) / IMPORT_RECORD)
    return record


def export_stage(cfg: Config, run: str, run_dir: Path, snapshot: Path, out: Path,
                 data_dir: Path | None = None, *, use_ema: bool = False) -> dict[str, Any]:
    """Export ``snapshot`` in the Hugging Face format (child run ``export``) and log it as an
    MLflow logged model of the ``train`` run that made it (:func:`.final_results.model_spec`:
    config, step, validation loss on the pack; the weights stay in ``out``)."""
    from ..export import export_snapshot
    from ..tracking import start_stage
    from ..tracking.lineage import pack_digest
    from .final_results import model_spec

    check_stage_outputs(cfg, run_dir, inputs=[("--snapshot", snapshot)])
    provenance = export_snapshot(Path(snapshot), Path(out), use_ema=use_ema)
    dataset = None
    if data_dir is not None and (Path(data_dir) / "metadata.json").is_file():
        meta = json.loads((Path(data_dir) / "metadata.json").read_text())
        dataset = {"name": str(meta.get("data_id") or Path(data_dir).name),
                   "digest": pack_digest(meta)}
    train_run = json.loads((Path(snapshot) / "trainer_state.json").read_text()).get(
        "tracking_run_id")
    with start_stage(cfg, run_dir, "export", params={"export.use_ema": use_ema},
                     tags={"loopline.export_dir": str(Path(out).absolute())}) as stage:
        if stage.enabled and train_run is None:
            log.warning("%s has no train run id (trained with tracking off); no logged model",
                        snapshot)
        spec, files = model_spec(run, Path(snapshot), Path(out), dataset)
        model_id = stage.log_model(train_run, spec, files)
        if model_id:
            stage.set_tags({"loopline.model_id": model_id})
    return provenance


def finish_run(cfg: Config, run_dir: Path, out: Path) -> dict[str, Any]:
    """Rule ``track_done``: every target of the run is built, so its parent run is FINISHED;
    ``out`` records when and which parent."""
    import time

    from ..tracking import finish_parent

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
            from ..tracking import finish_parent

            finish_parent(run_plan.config, run_dir, status)
            closed.append(name)
        except Exception as exc:  # noqa: BLE001 (a handler must not mask the run's outcome)
            log.warning("could not set the parent run of %s to %s: %s", name, status,
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    return closed
