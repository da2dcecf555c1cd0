"""One door per stage: the CLI command and the Snakemake rule call the same stage function,
so the tiny pipeline's products (rule calls) are reproduced by the commands run in a twin
working directory: the same bytes, and, tracked, child runs of the same shape (params,
metric keys and steps, artifacts, tags) in the twin's own MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.stage_runs import child_runs, cli, metric_values, run_shape
from support.workflow_runs import TINY

pytestmark = pytest.mark.slow

RUN = "loops1"
STEPS = (10, 20, 30)  # the tiny config's segment ends


def _data_id(workdir: Path) -> str:
    [data_id] = [p.name for p in (workdir / "results" / "data").iterdir()
                 if p.is_dir() and not p.name.startswith(".")]
    return data_id


@pytest.fixture(scope="module")
def twin(tiny_pipeline: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stages of run ``loops1`` repeated through the commands, in a fresh directory whose
    default store (``sqlite:///results/mlflow.db``) is its own."""
    root = tmp_path_factory.mktemp("twin")
    data_id = _data_id(tiny_pipeline)
    data, run = Path("results/data") / data_id, Path("results") / RUN
    config = ["--config", TINY, "--run", RUN]
    cli(root, "pack", *config, "--out", data)
    previous: Path | str = "none"
    for step in STEPS:
        out = run / "snapshots" / f"step_{step:07d}"
        cli(root, "train", *config, "--data", data, "--resume-from", previous,
            "--until-step", step, "--out", out)
        previous = out
    final = run / "snapshots" / f"step_{STEPS[-1]:07d}"
    kept = [run / "snapshots" / f"step_{step:07d}" for step in STEPS[1:]]  # keep_last: 2
    cli(root, "snapshot-index", *kept, "--out", run / "snapshots" / "index.json")
    cli(root, "heff", "--snapshot", final, "--data", data, "--out",
        run / "eval" / "heff" / f"step_{STEPS[-1]:07d}.json")
    cli(root, "export", "--snapshot", final, "--data", data, "--out", run / "export")
    return root


def _same_files(a: Path, b: Path) -> None:
    """Every file under ``a`` is under ``b`` with the same bytes (the working directory's
    path, which an export records, read as ``ROOT``), and no other (Snakemake's marker of a
    directory output aside)."""
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*")
                   if p.is_file() and p.name != ".snakemake_timestamp")
    assert names == sorted(str(p.relative_to(b)) for p in b.rglob("*")
                           if p.is_file() and p.name != ".snakemake_timestamp")
    for name in names:
        ours, theirs = (_rooted(root / name, root) for root in (a, b))
        assert ours == theirs, name


def _rooted(path: Path, inside: Path) -> bytes:
    workdir = next(p for p in inside.parents if (p / "results").is_dir())
    return path.read_bytes().replace(str(workdir.resolve()).encode(), b"ROOT")


def test_pack_train_and_export_write_what_the_rules_wrote(tiny_pipeline: Path, twin: Path):
    data_id = _data_id(tiny_pipeline)
    _same_files(tiny_pipeline / "results" / "data" / data_id, twin / "results" / "data" / data_id)
    for step in STEPS[1:]:  # the rule kept steps 20 and 30 (keep_last: 2)
        name = f"step_{step:07d}"
        ours = twin / "results" / RUN / "snapshots" / name
        theirs = tiny_pipeline / "results" / RUN / "snapshots" / name
        for file in ("model.safetensors", "optimizer.safetensors", "config.yaml"):
            assert (ours / file).read_bytes() == (theirs / file).read_bytes(), (name, file)
    _same_files(tiny_pipeline / "results" / RUN / "export", twin / "results" / RUN / "export")


def test_the_index_command_writes_what_the_rule_wrote(tiny_pipeline: Path, twin: Path):
    ours, theirs = (w / "results" / RUN / "snapshots" for w in (twin, tiny_pipeline))
    assert (ours / "index.json").read_text() == (theirs / "index.json").read_text()
    assert (ours / "final").readlink() == (theirs / "final").readlink()


def test_the_heff_command_writes_what_the_rule_wrote(tiny_pipeline: Path, twin: Path):
    name = f"eval/heff/step_{STEPS[-1]:07d}.json"
    ours = json.loads((twin / "results" / RUN / name).read_text())
    theirs = json.loads((tiny_pipeline / "results" / RUN / name).read_text())
    assert ours == theirs


def test_tracked_commands_open_child_runs_of_the_rules_shape(tiny_pipeline: Path, twin: Path):
    ours, theirs = (child_runs(w, "loopline-tiny", RUN) for w in (twin, tiny_pipeline))
    stages = ["train", f"eval_heff/step_{STEPS[-1]:07d}", "export"]
    assert set(stages) <= set(ours) and set(stages) <= set(theirs)
    for stage in stages:
        assert run_shape(*ours[stage]) == run_shape(*theirs[stage]), stage
    for stage, prefixes in (("train", ("train/loss", "val/loss")),
                            (stages[1], ("heff/loss", "heff/best"))):
        values = metric_values(*ours[stage], prefixes)
        assert values and values == metric_values(*theirs[stage], prefixes), stage
    # one train run continued over the three segments, every step once
    client, train = ours["train"]
    history = client.get_metric_history(train.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS[-1] + 1))


def test_the_compare_command_writes_what_the_rule_wrote(tiny_pipeline: Path, tmp_path: Path):
    """Rule ``compare_runs`` (the runs' files as its inputs) and command ``compare`` (the run
    directories) go through one door: the same table, summary and depth check."""
    runs = [tiny_pipeline / "results" / name for name in ("loops1", "loops2")]  # config order
    cli(tmp_path, "compare", *runs, "--out", tmp_path / "compare")
    for name in ("summary.md", "summary.parquet", "depth_check.json"):
        ours, theirs = (w / name for w in (tmp_path / "compare", tiny_pipeline / "results" /
                                           "compare"))
        assert ours.read_bytes() == theirs.read_bytes(), name
