"""Acceptance: a user's own pointer-chasing corpus (prompt/answer/level fields) and a local
lm-eval task, run through ``snakemake --configfile``; the summary holds the user task's
accuracy per level at every H_eff. Also: editing the task reruns the benchmark, and a
misspelt task stops the workflow before any job starts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from support.workflow_runs import snakemake

pytestmark = pytest.mark.slow
BENCH_H_EFF = [1, 2, 4]
LEVELS = [1, 2, 3]
VARS = "abcdefgh"


def pointer_problem(rng: random.Random, hops: int) -> tuple[str, str]:
    """``a=3;b=a;c=b;print(c)=`` → ``3``: the answer is ``hops - 1`` pointers away."""
    names = rng.sample(VARS, hops)
    value = str(rng.randrange(10))
    parts = [f"{names[0]}={value}"] + [f"{names[i]}={names[i - 1]}" for i in range(1, hops)]
    return ";".join(parts) + f";print({names[-1]})=", value


def write_corpus(path: Path, docs: int, seed: int) -> None:
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i in range(docs):
            level = LEVELS[i % len(LEVELS)]
            prompt, answer = pointer_problem(rng, level)
            fh.write(json.dumps({"prompt": prompt, "answer": answer, "level": level}) + "\n")


def write_task(folder: Path, per_level: int, seed: int) -> None:
    """A multiple-choice lm-eval task whose data_files path is relative to its YAML."""
    rng = random.Random(seed)
    (folder / "data").mkdir(parents=True, exist_ok=True)
    with (folder / "data" / "pointer_test.jsonl").open("w") as fh:
        for level in LEVELS:
            for _ in range(per_level):
                prompt, answer = pointer_problem(rng, level)
                wrong = str((int(answer) + rng.randrange(1, 10)) % 10)
                choices = rng.sample([answer, wrong], 2)
                fh.write(json.dumps({"prompt": prompt, "choices": choices,
                                     "label": choices.index(answer), "level": level}) + "\n")
    (folder / "pointer.yaml").write_text(yaml.safe_dump({
        "task": "user_pointer", "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": "data/pointer_test.jsonl"}},
        "test_split": "test", "output_type": "multiple_choice", "doc_to_text": "prompt",
        "doc_to_choice": "choices", "doc_to_target": "label", "target_delimiter": "",
        "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}],
    }, sort_keys=False))


@pytest.fixture(scope="module")
def user_setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Corpus, task folder and the user's config file, away from the working directory."""
    home = tmp_path_factory.mktemp("user")
    write_corpus(home / "corpus" / "pointers.jsonl", docs=300, seed=1)
    write_task(home / "tasks", per_level=4, seed=2)
    config = home / "user.yaml"
    config.write_text(yaml.safe_dump({
        "experiment": {"name": "loopline-user-data"},
        "tracking": {"enabled": False},  # not what this test is about; saves MLflow start-ups
        "data": {"sources": [{"type": "jsonl", "path": str(home / "corpus" / "*.jsonl"),
                              "prompt_field": "prompt", "answer_field": "answer",
                              "level_field": "level"}]},
        "train": {"total_steps": 10, "steps_per_segment": 10, "eval_interval": 0,
                  "diagnostics_interval": 0},
        "eval": {"h_eff": [1, 2]},
        "bench": {"tasks": ["loopline_khop"], "include_path": str(home / "tasks"),
                  "h_eff": BENCH_H_EFF, "examples_per_level": 2, "max_difficulty": 3},
        "runs": {"loops2": {"model": {"loops": 2}}},
    }))
    return {"home": home, "config": config}


@pytest.fixture(scope="module")
def user_pipeline(user_setup, tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("pipeline")
    result = snakemake(workdir, "--cores", "2", extra_configs=(user_setup["config"],))
    if result.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-3000:]}"
                         for p in (workdir / "logs").rglob("*.log"))
        pytest.fail(f"user-data pipeline failed:\n{result.stderr[-6000:]}\n{logs[-12000:]}")
    return workdir


def test_user_task_is_scored_per_level_at_every_h_eff(user_pipeline: Path):
    base = user_pipeline / "results" / "loops2" / "bench"
    table = pq.read_table(base / "summary.parquet").to_pylist()
    user_rows = [r for r in table if r["task"] == "user_pointer" and r["metric"] == "acc"
                 and r["level"] is not None]
    cells = {(r["h_eff"], r["level"]): r["value"] for r in user_rows}
    assert sorted(cells) == [(h, lv) for h in BENCH_H_EFF for lv in LEVELS]
    assert all(v in (0.0, 0.25, 0.5, 0.75, 1.0) for v in cells.values())  # 4 examples a level
    assert {r["n"] for r in user_rows} == {4}
    report = json.loads((base / "step_0000010.json").read_text())
    assert list(report["tasks"]) == ["loopline_khop", "user_pointer"]  # next to the built-in
    info = report["tasks"]["user_pointer"]
    assert info["metric"] == "acc" and info["chance"] == 0.5
    for h in BENCH_H_EFF:
        levels = info["h_eff"][str(h)]["levels"]
        assert {lv: levels[str(lv)]["acc"] for lv in LEVELS} == \
            {lv: cells[(h, lv)] for lv in LEVELS}


def test_editing_the_task_reruns_only_the_benchmark(user_pipeline: Path, user_setup):
    task_yaml = user_setup["home"] / "tasks" / "pointer.yaml"
    task_yaml.write_text(task_yaml.read_text() + "# edited\n")
    result = snakemake(user_pipeline, "--cores", "1", "-n",
                       extra_configs=(user_setup["config"],))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bench_downstream" in result.stdout
    assert "train_segment" not in result.stdout and "pack_data" not in result.stdout


def test_unknown_task_stops_the_workflow_before_any_job(user_setup, tmp_path: Path):
    typo = tmp_path / "typo.yaml"
    typo.write_text("bench:\n  tasks: [user_pointr]\n")
    result = snakemake(tmp_path, "--cores", "1", "-n",
                       extra_configs=(user_setup["config"], typo))
    assert result.returncode != 0
    assert "bench.tasks names unknown task(s) ['user_pointr']" in result.stdout + result.stderr
    assert "Job stats" not in result.stdout
