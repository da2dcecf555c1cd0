"""Stage commands run as a user runs them, and the MLflow child runs they leave, for the
tests that hold a command and its Snakemake rule to the same door (imported by name from
``support``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# tags whose values name a working directory or an id, not what the stage did
VOLATILE_TAGS = ("loopline.export_dir", "loopline.snapshot", "loopline.model_id",
                 "loopline.data_dir", "loopline.key")


def cli(cwd: Path, *args: str | Path) -> str:
    """``python -m pipeline_lib ARGS`` in ``cwd`` (one compute thread, the config's own
    tracking store); its stdout, or a failed assertion with its stderr."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    result = subprocess.run([sys.executable, "-m", "pipeline_lib", *map(str, args)], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def child_runs(workdir: Path, experiment: str, run: str) -> dict[str, tuple[Any, Any]]:
    """{stage: (client, child run)} of ``run`` in ``workdir``'s store (results/mlflow.db)."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`loopline.run` = '{run}'",
                              max_results=200)
    return {r.data.tags["loopline.stage"]: (client, r) for r in runs
            if "loopline.stage" in r.data.tags}


def run_shape(client: Any, run: Any) -> dict[str, Any]:
    """What a stage's child run holds: params, the steps of every metric, artifact paths
    (TensorBoard's event files, named after host and time, as a count), tags (the values of
    the volatile ones left out), status."""
    steps = {key: sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
             for key in run.data.metrics}
    artifacts, todo = [], [None]
    while todo:
        for item in client.list_artifacts(run.info.run_id, todo.pop()):
            (todo if item.is_dir else artifacts).append(item.path)
    events = [a for a in artifacts if a.startswith("tensorboard/")]
    tags = {k: ("…" if k in VOLATILE_TAGS else v) for k, v in run.data.tags.items()
            if not k.startswith("mlflow.")}
    return {"params": run.data.params, "metrics": steps, "tensorboard_files": len(events),
            "artifacts": sorted(set(artifacts) - set(events)), "tags": tags,
            "status": run.info.status}


def metric_values(client: Any, run: Any, prefixes: tuple[str, ...]
                  ) -> dict[str, dict[int, float]]:
    """The run's metrics whose keys start with ``prefixes``: {key: {step: value}}."""
    return {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in run.data.metrics if key.startswith(prefixes)}
