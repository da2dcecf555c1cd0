"""The latent trajectories of one snapshot (opt-in): child run ``trajectories/step_…`` of the
variant's parent run, with the per-loop measures as metrics at step = loop t."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...evaluate.trajectories import DEFAULT_TOKENS, check_trajectory_args, run_trajectories
from ...model.kernels import kernel_tags
from ...spec.config import Config
from ...spec.layout import TRAJECTORIES_FIGURE, TRAJECTORIES_JSON
from ...tracking import start_stage
from .common import check_stage_outputs, step_name


def trajectories_stage(cfg: Config, run_dir: Path, snapshot: Path, data_dir: Path,
                       out_dir: Path, *, tokens: int | None = None,
                       max_loops: int | None = None) -> dict[str, Any]:
    """Trajectories of ``tokens`` (default 256) sampled validation tokens over loops
    1..``max_loops`` (default 2 × ``model.loops``) into ``out_dir``
    (:func:`pipeline_lib.evaluate.trajectories.run_trajectories`; ``eval.batch_rows``,
    ``eval.use_ema``, ``experiment.device`` and ``experiment.precision`` as the H_eff sweep),
    tracked as ``trajectories/step_…``: per loop t the mean and median of each measure
    (``trajectories/{measure}_mean``, ``…_q50`` at step t), the share of each class (step 0),
    the JSON and the figure as artifacts."""
    tokens = DEFAULT_TOKENS if tokens is None else tokens
    check_trajectory_args(tokens, max_loops)
    check_stage_outputs(cfg, run_dir, [(out_dir, None)],
                        [("--snapshot", snapshot), ("--data", data_dir)])
    result = run_trajectories(Path(snapshot), Path(data_dir), Path(out_dir), tokens=tokens,
                              max_loops=max_loops, batch_rows=cfg.eval.batch_rows,
                              use_ema=cfg.eval.use_ema, device=cfg.experiment.device,
                              precision=cfg.experiment.precision)
    with start_stage(cfg, run_dir, f"trajectories/{step_name(result['step'])}",
                     params={"trajectories.tokens": tokens,
                             "trajectories.max_loops": result["max_loops"],
                             "trajectories.seed": result["seed"], "eval.use_ema": cfg.eval.use_ema,
                             "device": result["device"], "precision": result["precision"]},
                     tags=kernel_tags()) as stage:
        for i, loop in enumerate(result["loops"]):
            stage.log_metrics(loop, {f"trajectories/{name}_{stat}": summary[stat][i]
                                     for name, summary in result["measures"].items()
                                     for stat in ("mean", "q50")})
        stage.log_metrics(0, {f"trajectories/{name}_share": count / result["tokens"]
                              for name, count in result["classes"].items()})
        for name in (TRAJECTORIES_JSON, TRAJECTORIES_FIGURE):
            stage.log_artifact(Path(out_dir) / name, "eval/trajectories")
    return result
