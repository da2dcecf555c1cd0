"""Built-in task files: absolute paths, levels, seeded content, lm-eval loadable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pipeline_lib.bench.tasks import BUILTIN_TASKS, write_builtin_tasks
from pipeline_lib.data.reasoning import generate_problems
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import BenchConfig


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_task_files_have_absolute_paths_levels_and_answers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bench = BenchConfig(examples_per_level=3, min_difficulty=2, max_difficulty=5,
                        tasks=["loopline_khop", "hellaswag", "loopline_addition", "loopline_parity"])
    names = write_builtin_tasks(bench, Path("rel/tasks"))  # a relative dir still gives abs paths
    assert names == ["loopline_khop", "loopline_addition", "loopline_parity"]
    assert sorted(p.name for p in (tmp_path / "rel/tasks").iterdir()) == sorted(
        f"{n}.{ext}" for n in names for ext in ("yaml", "jsonl"))
    for name in names:
        cfg = yaml.safe_load((tmp_path / "rel/tasks" / f"{name}.yaml").read_text())
        data_file = Path(cfg["dataset_kwargs"]["data_files"]["test"])
        assert data_file.is_absolute() and data_file == tmp_path / "rel/tasks" / f"{name}.jsonl"
        assert cfg["task"] == name and cfg["output_type"] == BUILTIN_TASKS[name].output_type
        rows = read_rows(data_file)
        assert [r["level"] for r in rows] == [2, 3, 4, 5] * 3  # interleaved, 3 per level
        for level in range(2, 6):
            problems = generate_problems(BUILTIN_TASKS[name].generator, level, 3, bench.seed)
            mine = [r for r in rows if r["level"] == level]
            assert [r["prompt"] for r in mine] == [p.prompt for p in problems]
            assert [r["answer"] for r in mine] == [p.answer for p in problems]
            for row, problem in zip(mine, problems, strict=True):
                if cfg["output_type"] == "multiple_choice":
                    assert sorted(row["choices"]) == sorted([problem.answer, *problem.distractors])
                    assert row["choices"][row["label"]] == problem.answer
    addition = yaml.safe_load((tmp_path / "rel/tasks/loopline_addition.yaml").read_text())
    assert addition["generation_kwargs"]["max_gen_toks"] == bench.max_gen_toks
    assert addition["metric_list"][0]["metric"] == "exact_match"


def test_task_files_are_deterministic_and_seeded(tmp_path):
    bench = BenchConfig(examples_per_level=4, max_difficulty=3, tasks=["loopline_khop"])
    write_builtin_tasks(bench, tmp_path / "a")
    write_builtin_tasks(bench, tmp_path / "b")
    first = (tmp_path / "a/loopline_khop.jsonl").read_bytes()
    assert first == (tmp_path / "b/loopline_khop.jsonl").read_bytes()
    mtime = (tmp_path / "a/loopline_khop.jsonl").stat().st_mtime_ns
    write_builtin_tasks(bench, tmp_path / "a")  # unchanged bytes are not rewritten
    assert (tmp_path / "a/loopline_khop.jsonl").stat().st_mtime_ns == mtime
    other = BenchConfig(examples_per_level=4, max_difficulty=3, tasks=["loopline_khop"], seed=7)
    write_builtin_tasks(other, tmp_path / "c")
    prompts = {r["prompt"] for r in read_rows(tmp_path / "a/loopline_khop.jsonl")}
    assert prompts.isdisjoint(r["prompt"] for r in read_rows(tmp_path / "c/loopline_khop.jsonl"))


def test_unknown_builtin_task_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="loopline_kop"):
        write_builtin_tasks(BenchConfig(tasks=["loopline_kop"]), tmp_path)


def test_lm_eval_loads_the_task_files(tmp_path):
    from lm_eval.tasks import TaskManager

    bench = BenchConfig(examples_per_level=2, max_difficulty=2)
    names = write_builtin_tasks(bench, tmp_path)
    loaded = TaskManager(include_path=str(tmp_path), include_defaults=False).load(names)
    assert sorted(loaded["tasks"]) == sorted(names)
    khop = loaded["tasks"]["loopline_khop"]
    docs = list(khop.test_docs())
    assert len(docs) == 4 and khop.doc_to_text(docs[0]) == docs[0]["prompt"]
    assert khop.doc_to_choice(docs[0])[khop.doc_to_target(docs[0])] == docs[0]["answer"]
