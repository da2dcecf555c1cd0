"""bench.tasks / bench.include_path checks without lm-eval: user task folders, installed names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from user_task_helpers import write_user_tasks

from pipeline_lib import task_catalog, task_yaml
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import BenchConfig
from pipeline_lib.task_catalog import (
    check_bench_tasks,
    installed_task_names,
    resolve_data_entry,
    scan_include_path,
    selected_tasks,
    user_task_inputs,
)

BUILTINS = ["loopline_khop", "loopline_addition", "loopline_parity"]


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    return write_user_tasks(tmp_path / "my_tasks")


@pytest.fixture
def names_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache directory and a cold in-memory cache for installed task names."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    installed_task_names.cache_clear()
    yield tmp_path / "cache" / "loopline"
    installed_task_names.cache_clear()


def test_scan_finds_tasks_tags_includes_and_data_files(user_dir: Path):
    scan = scan_include_path(str(user_dir))
    assert scan.tasks == {"my_pointer": user_dir / "pointer.yaml",
                          "my_echo": user_dir / "gen" / "echo.yaml"}
    assert scan.other_names == {"my_suite"}
    assert scan.config_files == tuple(sorted(p.resolve() for p in (
        user_dir / "pointer.yaml", user_dir / "gen" / "echo.yaml",
        user_dir / "gen" / "_echo_template_yaml")))
    assert scan.data_files == (user_dir / "data" / "pointer.jsonl", user_dir / "gen" / "echo.jsonl")
    assert user_task_inputs(str(user_dir)) == sorted(str(p) for p in (
        user_dir / "pointer.yaml", user_dir / "data" / "pointer.jsonl",
        user_dir / "gen" / "echo.yaml", user_dir / "gen" / "_echo_template_yaml",
        user_dir / "gen" / "utils.py", user_dir / "gen" / "echo.jsonl"))
    assert user_task_inputs("") == []


def test_relative_data_paths_resolve_next_to_the_yaml_then_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    yaml_path = tmp_path / "tasks" / "t.yaml"
    (tmp_path / "tasks" / "d").mkdir(parents=True)
    (tmp_path / "tasks" / "d" / "a.jsonl").write_text("{}\n")
    (tmp_path / "cwd" / "d").mkdir(parents=True)
    (tmp_path / "cwd" / "d" / "b.jsonl").write_text("{}\n")
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_data_entry("d/a.jsonl", yaml_path) == tmp_path / "tasks" / "d" / "a.jsonl"
    assert resolve_data_entry("d/b.jsonl", yaml_path) == tmp_path / "cwd" / "d" / "b.jsonl"
    assert resolve_data_entry("d/*.jsonl", yaml_path) == tmp_path / "tasks" / "d" / "*.jsonl"
    assert resolve_data_entry("d/c.jsonl", yaml_path) is None
    assert resolve_data_entry(str(tmp_path / "cwd" / "d" / "b.jsonl"), yaml_path) == \
        tmp_path / "cwd" / "d" / "b.jsonl"


def test_selection_runs_every_user_task_unless_bench_tasks_names_some(user_dir: Path):
    scan = scan_include_path(str(user_dir))
    everything = BenchConfig(include_path=str(user_dir))
    assert selected_tasks(everything, scan) == [*BUILTINS, "my_echo", "my_pointer"]
    named = BenchConfig(tasks=["loopline_khop", "my_echo"], include_path=str(user_dir))
    assert selected_tasks(named, scan) == ["loopline_khop", "my_echo"]
    by_tag = BenchConfig(tasks=["my_suite"], include_path=str(user_dir))
    assert selected_tasks(by_tag, scan) == ["my_suite"]
    only_user = BenchConfig(tasks=[], include_path=str(user_dir))
    assert check_bench_tasks(only_user) == ["my_echo", "my_pointer"]
    assert check_bench_tasks(BenchConfig()) == BUILTINS
    assert check_bench_tasks(BenchConfig(tasks=[])) == []  # no downstream benchmarks


def _one_line_error(bench: BenchConfig, pattern: str) -> str:
    with pytest.raises(ConfigError, match=pattern) as info:
        check_bench_tasks(bench)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_bad_include_paths_are_one_line_config_errors(tmp_path: Path, user_dir: Path):
    _one_line_error(BenchConfig(include_path=str(tmp_path / "nope")),
                    r"bench\.include_path = '.*nope' is not a directory")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("no tasks here\n")
    (tmp_path / "empty" / "template.yaml").write_text("output_type: multiple_choice\n")
    _one_line_error(BenchConfig(include_path=str(tmp_path / "empty")),
                    r"bench\.include_path = '.*empty' holds no task YAML")
    (user_dir / "data" / "pointer.jsonl").unlink()
    message = _one_line_error(BenchConfig(include_path=str(user_dir)),
                              r"pointer\.yaml: dataset_kwargs\.data_files 'data/pointer\.jsonl' "
                              r"matches no file next to the YAML")
    assert "fix the path" in message
    (user_dir / "gen" / "broken.yaml").write_text("task: [unclosed\n")
    _one_line_error(BenchConfig(include_path=str(user_dir)), r"broken\.yaml cannot be read as YAML")


def test_reserved_prefix_and_unknown_task_names(tmp_path: Path, user_dir: Path, names_cache):
    (user_dir / "mine.yaml").write_text("task: loopline_mine\ndataset_path: json\n")
    _one_line_error(BenchConfig(include_path=str(user_dir)),
                    r"defines task 'loopline_mine' in .*mine\.yaml; the loopline_ prefix is "
                    r"reserved")
    (user_dir / "mine.yaml").unlink()
    message = _one_line_error(
        BenchConfig(tasks=["loopline_khop", "my_pointr"], include_path=str(user_dir)),
        r"bench\.tasks names unknown task\(s\) \['my_pointr'\]")
    assert f"not in bench.include_path ({user_dir})" in message
    _one_line_error(BenchConfig(tasks=["hellaswagg"]), r"unknown task\(s\) \['hellaswagg'\]")


def test_installed_lm_eval_names_are_known_and_cached_on_disk(names_cache: Path, monkeypatch):
    tasks = ["loopline_khop", "hellaswag", "mmlu", "ai2_arc"]  # a task, a group, a tag
    assert check_bench_tasks(BenchConfig(tasks=tasks)) == tasks
    (cache_file,) = names_cache.glob("lm_eval_task_names_*.json")
    names = json.loads(cache_file.read_text())
    assert {"hellaswag", "mmlu", "ai2_arc", "arc_easy"} <= set(names) and len(names) > 10_000
    installed_task_names.cache_clear()

    def no_scan(root):
        raise AssertionError("scanned again despite the cache")

    monkeypatch.setattr(task_catalog, "_scan_installed", no_scan)
    assert "hellaswag" in installed_task_names()


def test_quick_keys_read_quoted_keys_and_lists(tmp_path: Path):
    path = tmp_path / "t.yaml"
    path.write_text('"task": "a_task"  # comment\ntag:\n  - t1\n  - "t2"\ninclude: [x, y]\n'
                    "group: g\ndataset_path: json\n")
    assert task_catalog._quick_keys(path) == {"task": "a_task", "tag": ["t1", "t2"],
                                              "include": ["x", "y"], "group": "g"}


@pytest.mark.slow
def test_installed_names_equal_lm_eval_task_index(names_cache):
    from lm_eval.tasks import TaskManager

    assert installed_task_names() == set(TaskManager().all_tasks)


def test_checking_stays_light(tmp_path: Path, user_dir: Path):
    """What the Snakefile runs: no torch, mlflow or lm_eval import, even for installed names."""
    code = ("import sys; from pipeline_lib.spec.config import BenchConfig; "
            "from pipeline_lib.task_catalog import check_bench_tasks; "
            f"check_bench_tasks(BenchConfig(tasks=['hellaswag'], include_path={str(user_dir)!r}));"
            "heavy = [m for m in ('torch', 'mlflow', 'lm_eval') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


def test_user_yaml_keeps_function_tags(user_dir: Path):
    cfg = task_yaml.load_task_yaml(user_dir / "gen" / "echo.yaml")
    assert cfg["process_docs"] == task_yaml.YamlTag("!function", "utils.keep_all")
    assert yaml.safe_load((user_dir / "pointer.yaml").read_text())["task"] == "my_pointer"
