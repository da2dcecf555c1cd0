"""One door per stage: the CLI command and the Snakemake rule call the same stage function,
so the tiny pipeline's products (rule calls) are reproduced by the commands run in a twin
working directory: the same bytes, and, tracked, child runs of the same shape (params,
metric keys and steps, artifacts, tags) in the twin's own MLflow store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.workflow_runs import TINY

pytestmark = pytest.mark.slow

RUN = "loops1"
STEPS = (10, 20, 30)  # the tiny config's segment ends
# tags whose values name this working directory, a run id or a time, not the stage's result
VOLATILE_TAGS = ("loopline.export_dir", "loopline.snapshot", "loopline.model_id",
                 "loopline.data_dir")


def _cli(cwd: Path, *args: str | Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    result = subprocess.run([sys.executable, "-m", "pipeline_lib", *map(str, args)], cwd=cwd,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.fixture(scope="module")
def twin(tiny_pipeline: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stages of run ``loops1`` repeated through the commands, in a fresh directory whose
    default store (``sqlite:///results/mlflow.db``) is its own."""
    root = tmp_path_factory.mktemp("twin")
    [data_id] = [p.name for p in (tiny_pipeline / "results" / "data").iterdir()]
    data, run = Path("results/data") / data_id, Path("results") / RUN
    config = ["--config", TINY, "--run", RUN]
    _cli(root, "pack", *config, "--out", data)
    previous: Path | str = "none"
    for step in STEPS:
        out = run / "snapshots" / f"step_{step:07d}"
        _cli(root, "train", *config, "--data", data, "--resume-from", previous,
             "--until-step", step, "--out", out)
        previous = out
    final = run / "snapshots" / f"step_{STEPS[-1]:07d}"
    _cli(root, "heff", "--snapshot", final, "--data", data, "--out",
         run / "eval" / "heff" / f"step_{STEPS[-1]:07d}.json")
    _cli(root, "export", "--snapshot", final, "--data", data, "--out", run / "export")
    return root


def _same_files(a: Path, b: Path) -> None:
    """Every file under ``a`` is under ``b`` with the same bytes (the working directory's
    path, which an export records, read as ``ROOT``), and no other."""
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file())
    for name in names:
        ours, theirs = (_rooted(root / name, root) for root in (a, b))
        assert ours == theirs, name


def _rooted(path: Path, inside: Path) -> bytes:
    workdir = next(p for p in inside.parents if (p / "results").is_dir())
    return path.read_bytes().replace(str(workdir.resolve()).encode(), b"ROOT")


def _children(workdir: Path) -> dict[str, Any]:
    """{stage: child run} of RUN in the working directory's store."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("loopline-tiny")
    runs = client.search_runs([experiment.experiment_id],
                              f"tags.`loopline.run` = '{RUN}'", max_results=200)
    return {r.data.tags["loopline.stage"]: (client, r) for r in runs
            if "loopline.stage" in r.data.tags}


def _shape(client: Any, run: Any) -> dict[str, Any]:
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


def _values(client: Any, run: Any, prefixes: tuple[str, ...]) -> dict[str, dict[int, float]]:
    """The deterministic metrics of a run (losses, not timings): {key: {step: value}}."""
    return {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
            for key in run.data.metrics if key.startswith(prefixes)}


def test_pack_train_and_export_write_what_the_rules_wrote(tiny_pipeline: Path, twin: Path):
    [data_id] = [p.name for p in (tiny_pipeline / "results" / "data").iterdir()]
    _same_files(tiny_pipeline / "results" / "data" / data_id, twin / "results" / "data" / data_id)
    for step in STEPS[1:]:  # the rule kept steps 20 and 30 (keep_last: 2)
        name = f"step_{step:07d}"
        ours = twin / "results" / RUN / "snapshots" / name
        theirs = tiny_pipeline / "results" / RUN / "snapshots" / name
        for file in ("model.safetensors", "optimizer.safetensors", "config.yaml"):
            assert (ours / file).read_bytes() == (theirs / file).read_bytes(), (name, file)
    _same_files(tiny_pipeline / "results" / RUN / "export", twin / "results" / RUN / "export")


def test_the_heff_command_writes_what_the_rule_wrote(tiny_pipeline: Path, twin: Path):
    name = f"eval/heff/step_{STEPS[-1]:07d}.json"
    ours = json.loads((twin / "results" / RUN / name).read_text())
    theirs = json.loads((tiny_pipeline / "results" / RUN / name).read_text())
    assert ours == theirs


def test_tracked_commands_open_child_runs_of_the_rules_shape(tiny_pipeline: Path, twin: Path):
    ours, theirs = _children(twin), _children(tiny_pipeline)
    stages = ["train", f"eval_heff/step_{STEPS[-1]:07d}", "export"]
    assert set(stages) <= set(ours) and set(stages) <= set(theirs)
    for stage in stages:
        assert _shape(*ours[stage]) == _shape(*theirs[stage]), stage
    for stage, prefixes in (("train", ("train/loss", "val/loss")),
                            (stages[1], ("heff/loss", "heff/best"))):
        values = _values(*ours[stage], prefixes)
        assert values and values == _values(*theirs[stage], prefixes), stage
    # one train run continued over the three segments, every step once
    client, train = ours["train"]
    history = client.get_metric_history(train.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS[-1] + 1))
