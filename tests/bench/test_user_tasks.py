"""The user's task folder mirrored with absolute data paths, loadable from any directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from user_task_helpers import echo_rows, pointer_rows, write_user_tasks

from pipeline_lib.bench.user_tasks import prepare_user_tasks
from pipeline_lib.errors import ConfigError


def test_mirror_rewrites_data_paths_and_links_the_rest(tmp_path: Path):
    user = write_user_tasks(tmp_path / "mine")
    before = {p: p.read_bytes() for p in user.rglob("*") if p.is_file()}
    scan = prepare_user_tasks(str(user), tmp_path / "tasks" / "user")
    mirror = tmp_path / "tasks" / "user"
    assert sorted(scan.tasks) == ["my_echo", "my_pointer"]
    pointer = yaml.safe_load((mirror / "pointer.yaml").read_text())
    assert pointer["dataset_kwargs"]["data_files"] == {"test": str(user / "data" / "pointer.jsonl")}
    template = yaml.safe_load((mirror / "gen" / "_echo_template_yaml").read_text())
    assert template["dataset_kwargs"]["data_files"] == [str(user / "gen" / "echo.jsonl")]
    echo_text = (mirror / "gen" / "echo.yaml").read_text()
    assert "include: _echo_template_yaml" in echo_text
    assert "process_docs: !function 'utils.keep_all'" in echo_text
    assert os.readlink(mirror / "gen" / "utils.py") == str(user / "gen" / "utils.py")
    assert os.readlink(mirror / "data" / "pointer.jsonl") == str(user / "data" / "pointer.jsonl")
    assert {p: p.read_bytes() for p in user.rglob("*") if p.is_file()} == before  # untouched

    (user / "gen" / "echo.yaml").unlink()  # a second call replaces the mirror
    assert sorted(prepare_user_tasks(str(user), mirror).tasks) == ["my_pointer"]
    assert not (mirror / "gen" / "echo.yaml").exists()


def test_includes_outside_the_folder_become_absolute(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "base.yaml").write_text("output_type: multiple_choice\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "t.yaml").write_text("include: ../shared/base.yaml\ntask: t\n")
    prepare_user_tasks(str(mine), tmp_path / "out")
    assert yaml.safe_load((tmp_path / "out" / "t.yaml").read_text())["include"] == \
        str(shared / "base.yaml")


def test_missing_folder_is_a_config_error_naming_the_key(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"^--include_path = '.*nope' is not a directory"):
        prepare_user_tasks(str(tmp_path / "nope"), tmp_path / "out", "--include_path")


def test_lm_eval_loads_the_mirror_from_another_directory(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    from lm_eval.tasks import TaskManager

    user = write_user_tasks(tmp_path / "mine", level_field="hops")
    prepare_user_tasks(str(user), tmp_path / "tasks" / "user")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # relative data_files would fail from here
    manager = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False)
    assert {"my_pointer", "my_echo", "my_suite"} <= set(manager.all_tasks)
    loaded = manager.load(["my_suite"])["tasks"]
    assert [dict(d) for d in loaded["my_pointer"].test_docs()] == pointer_rows("hops")
    assert [dict(d) for d in loaded["my_echo"].test_docs()] == echo_rows("hops")
