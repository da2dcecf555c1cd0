"""The H_eff sweep of one snapshot: child run ``eval_heff/step_…`` of the variant's parent
run; the final snapshot's sweep also goes to the parent run (:mod:`..final_results`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...evaluate.exit.spec import ExitSpec
from ...evaluate.heff import parse_h_eff, run_heff
from ...model.kernels import kernel_tags
from ...output_paths import HEFF_JSON
from ...output_set import output_set
from ...spec.config import Config
from ...tracking import start_stage
from ..final_results import heff_values, is_final
from .common import check_stage_outputs, step_name


def heff_stage(cfg: Config, run_dir: Path, snapshot: Path, data_dir: Path,
               out: Path) -> dict[str, Any]:
    """H_eff sweep of one snapshot (``eval.*`` settings) as child run ``eval_heff/step_…``,
    on ``experiment.device`` in ``experiment.precision``; the final snapshot's sweep also
    goes to the parent run (``heff/final_loss`` at step = H_eff, see :mod:`.final_results`).
    Adaptive points log the loss and mean loops each token needs (``heff/adaptive_loss_tX``,
    ``…_loops_tX``) and what a cached decoder spends under each kv_fill
    (``heff/adaptive_spent_loss_latest_tX``, ``…_spent_loops_skip_tX``, …). A labelled pack's
    label accuracy and exact match per level (``heff/label_acc_L{level}_h{H}``,
    ``heff/label_exact_L{level}_h{H}``; ``Lall`` over every document)."""
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
    with start_stage(cfg, run_dir, f"eval_heff/{step_name(step)}",
                     params={"eval.h_eff": h_effs, "eval.max_tokens": cfg.eval.max_tokens,
                             "eval.use_ema": cfg.eval.use_ema, "device": result["device"],
                             "precision": result["precision"]}, tags=kernel_tags()) as stage:
        metrics = {f"heff/loss_h{h}": v for h, v in result["losses"].items()}
        metrics["heff/best_h"] = result["best_h_eff"]
        metrics["heff/deeper_better"] = float(result["deeper_better"])
        for i, section in enumerate(result.get("adaptive_by_criterion", {}).values()):
            name = "adaptive" if i == 0 else f"adaptive_{section['criterion']}"  # first: as before
            for point in section["points"]:
                t = f"t{point['threshold']:g}"
                metrics[f"heff/{name}_loss_{t}"] = point["loss"]
                metrics[f"heff/{name}_loops_{t}"] = point["mean_loops"]
                for fill, spent in point.get("spent", {}).items():  # a cached decoder's
                    metrics[f"heff/{name}_spent_loss_{fill}_{t}"] = spent["loss"]
                    metrics[f"heff/{name}_spent_loops_{fill}_{t}"] = spent["mean_loops"]
        metrics.update(_label_metrics(result.get("labels")))
        stage.log_metrics(step or 0, metrics)
        stage.log_artifact(out, "eval/heff")
        if is_final(Path(snapshot)):
            stage.log_headline("heff", heff_values(result), {"step": step})
    return result


def _label_metrics(labels: dict[str, Any] | None) -> dict[str, float]:
    """Label accuracy and exact match per level and H_eff of a sweep's ``labels`` section."""
    if not labels:
        return {}
    sections = {**labels["levels"], "all": labels["all"]}
    return {f"heff/label_{kind}_L{level}_h{h}": value
            for level, section in sections.items()
            for kind, key in (("acc", "accuracy"), ("exact", "exact_match"))
            for h, value in section[key].items()}
