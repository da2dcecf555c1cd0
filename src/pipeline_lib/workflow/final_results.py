"""The headline results of a run's final snapshot, as the parent run's metrics.

Each builder turns a stage's result into ``{key: {step: value}}`` for
:meth:`pipeline_lib.tracking.StageRun.log_headline`; curves use step = H_eff, so MLflow's
chart view draws them against H_eff (one line per variant), single numbers use step 0:

========================================  ======  =========================================
key                                       step    value
========================================  ======  =========================================
``heff/final_loss``                       H_eff   validation loss of the final snapshot
``heff/best_h_eff``, ``heff/best_loss``   0       the H_eff with the lowest loss, that loss
``bench/{task}/{metric}``                 H_eff   whole-task score (lm-eval's metric name)
``bench/{task}/{metric}_ci_low|_ci_high`` H_eff   its 95% interval (Wilson for 0/1 scores)
========================================  ======  =========================================

(The ``train`` group, size and cost, is built by :mod:`pipeline_lib.workflow.stages.train`.)
:func:`model_spec` describes the final snapshot's export as an MLflow logged model.
Torch- and MLflow-free.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec.config_write import flatten

Values = dict[str, dict[int, float]]


def snapshot_progress(snapshot: Path) -> tuple[int, int]:
    """(step, planned total steps) of a snapshot, from its ``trainer_state.json``."""
    state = json.loads((Path(snapshot) / "trainer_state.json").read_text())
    return int(state.get("step", 0)), int(state.get("total_steps") or 0)


def is_final(snapshot: Path) -> bool:
    """True for the snapshot of a run's last step (the one its headline results come from)."""
    try:
        step, total = snapshot_progress(snapshot)
    except (OSError, ValueError, TypeError):
        return False
    return total > 0 and step >= total


def heff_values(result: Mapping[str, Any]) -> Values:
    """Headline metrics of an H_eff sweep (``eval/heff/step_….json``)."""
    losses = {int(h): float(v) for h, v in result["losses"].items()}
    values: Values = {"heff/final_loss": losses}
    if losses:
        best = int(result.get("best_h_eff") or min(losses, key=lambda h: (losses[h], h)))
        values["heff/best_h_eff"] = {0: float(best)}
        values["heff/best_loss"] = {0: losses.get(best, min(losses.values()))}
    for level, section in (result.get("labels") or {}).get("levels", {}).items():
        # label accuracy against H_eff (step), one curve per level: the depth figure in the UI
        values[f"heff/label_accuracy_L{level}"] = {int(h): float(v)
                                                   for h, v in section["accuracy"].items()}
    return values


def bench_values(report: Mapping[str, Any]) -> Values:
    """Headline metrics of a benchmark result (``bench/step_….json``): whole-task scores at
    every H_eff (standard errors left out) and the per-sample metric's interval."""
    values: Values = defaultdict(dict)
    for task, info in report["tasks"].items():
        for h_eff, scores in info["h_eff"].items():
            h = int(h_eff)
            for metric, value in scores.get("overall", {}).items():
                if not metric.endswith("_stderr"):
                    values[f"bench/{task}/{metric}"][h] = float(value)
            for metric, interval in (scores.get("overall_ci") or {}).items():
                for bound in ("ci_low", "ci_high"):
                    if interval.get(bound) is not None:
                        values[f"bench/{task}/{metric}_{bound}"][h] = float(interval[bound])
    return dict(values)


WEIGHT_SUFFIXES = (".safetensors", ".safetensors.index.json", ".bin")


def model_spec(run: str, snapshot: Path, export_dir: Path,
               dataset: Mapping[str, str] | None) -> tuple[dict[str, Any], list[Path]]:
    """The logged model of an export (:func:`pipeline_lib.tracking.lineage.log_model`) and the
    files it carries: every file of the export but the weights, which stay in ``export_dir``
    (the tag ``loopline.export_dir`` points there). Its params are the export's
    ``config.json``; its metrics the snapshot's validation loss and tokens seen, measured
    on ``dataset`` (name and digest of the pack)."""
    snapshot, export_dir = Path(snapshot), Path(export_dir)
    state = json.loads((snapshot / "trainer_state.json").read_text())
    hf = json.loads((export_dir / "config.json").read_text())
    step = int(state["step"])
    digest = hashlib.sha256((snapshot / "MANIFEST.json").read_bytes()).hexdigest()[:16]
    weights = str((hf.get("loopline") or {}).get("weights", "model"))
    metrics = {"model/val_loss": state.get("val_loss"), "model/tokens_seen": state.get("tokens_seen")}
    spec = {
        "name": f"{run}-step{step}",
        "key": f"{run}/step_{step:07d}/{digest}/{weights}",
        "step": step,
        "params": {k: v for k, v in flatten(hf).items() if not isinstance(v, (list, dict))},
        "tags": {"loopline.run": run, "loopline.step": str(step), "loopline.weights": weights,
                 "loopline.export_dir": str(export_dir.absolute()),
                 "loopline.snapshot": str(snapshot.absolute())},
        "metrics": {k: float(v) for k, v in metrics.items()
                    if isinstance(v, (int, float)) and math.isfinite(float(v))},
        "dataset": dict(dataset) if dataset else None,
    }
    files = [p for p in sorted(export_dir.iterdir())
             if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES)]
    return spec, files
