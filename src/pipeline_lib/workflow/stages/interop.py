"""Hugging Face interop as stages: a pretrained source imported as the run's ``init``
snapshot (child run ``import``) and a snapshot exported in the Hugging Face format (child run
``export``, an MLflow logged model of the ``train`` run that made it)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ...export import export_snapshot
from ...retrofit.hf_import import IMPORT_RECORD, import_checkpoint
from ...spec.config import Config
from ...tracking import start_stage
from ...tracking.lineage import pack_digest
from ..final_results import model_spec
from .common import check_stage_outputs

log = logging.getLogger(__name__)


def import_stage(cfg: Config, planned: dict[str, Any], run_dir: Path, out: Path
                 ) -> dict[str, Any]:
    """``model.init_from`` (source, adapter; the layers of ``planned``, what the source
    resolved to: ``RunSpec.init``) imported as a snapshot at ``out`` (child run ``import``:
    source, layers, fingerprint as params, import time and size as metrics, the import record
    as an artifact). Rule ``import_init`` and ``import-hf``."""
    check_stage_outputs(cfg, run_dir)
    init = cfg.model.init_from
    record = import_checkpoint(init.source, out, cfg, adapter=init.adapter, planned=planned)
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
                 data_dir: Path | None = None, *, use_ema: bool = False,
                 tokenizer: Path | None = None) -> dict[str, Any]:
    """Export ``snapshot`` in the Hugging Face format (child run ``export``) and log it as an
    MLflow logged model of the ``train`` run that made it (:func:`..final_results.model_spec`:
    config, step, validation loss on the pack; the weights stay in ``out``). ``tokenizer``
    replaces the snapshot's own tokenizer.json. Rule ``export`` and the ``export`` command."""
    check_stage_outputs(cfg, run_dir, inputs=[("--snapshot", snapshot)])
    provenance = export_snapshot(Path(snapshot), Path(out), use_ema=use_ema,
                                 tokenizer=tokenizer)
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
