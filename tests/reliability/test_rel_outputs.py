"""Own nothing you did not make; a broken or lost tracking store is one line (issue 21).

- A command that writes a directory replaces only one it made (a pack's metadata.json, a
  snapshot's MANIFEST.json, an export's config.json, a comparison's files); any other
  non-empty directory is refused in one line, before the work, and left as it was.
- ``train --out DIR`` with DIR not a snapshot refuses before building anything: no
  ``train/`` or ``tensorboard/`` appears in the working directory.
- A tracking store that tracking.json relies on and that is missing, reset (emptied) or
  not a database is refused in one line before the stage's work (nothing written, no new
  store file); a parent run deleted from a store that still answers is recreated, with a
  warning saying so, and tracking.json points at the new one.

Each case runs ``python -m pipeline_lib`` in a subprocess and asserts the exit status, the
one ``error:`` line and that nothing was written, deleted or duplicated.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.output_rule import write_tiny_config
from support.rel_messages import assert_one_line_error, command_env, entries, run_cli

SNAPSHOT = Path("results") / "r" / "snapshots" / "step_0000004"


def _config(path: Path) -> Path:
    """Pack and a four-step segment take about a second each on this config."""
    return write_tiny_config(path)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory with a pack, a tracked run (track-init, one segment) and its
    SQLite store results/mlflow.db; tests copy it."""
    root = tmp_path_factory.mktemp("rel_outputs") / "work"
    root.mkdir()
    cfg = _config(root / "c.yaml")
    for args in (("pack", "--config", cfg, "--out", "data"),
                 ("track-init", "--config", cfg, "--run-dir", "results/r", "--data", "data"),
                 ("train", "--config", cfg, "--data", "data", "--resume-from", "none",
                  "--until-step", "4", "--out", SNAPSHOT)):
        result = run_cli(root, *args)
        assert result.returncode == 0, result.stderr
    return root


@pytest.fixture
def work(tracked: Path, tmp_path: Path) -> Path:
    """A copy of ``tracked`` whose tracking.json names the copy's store (its own path)."""
    work = Path(shutil.copytree(tracked, tmp_path / "work", symlinks=True))
    info = work / "results" / "r" / "tracking.json"
    info.write_text(info.read_text().replace(str(tracked), str(work)))
    return work


def _tree(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` with its bytes (what must not change)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def _mine(directory: Path) -> dict[str, bytes]:
    directory.mkdir(parents=True)
    (directory / "notes.txt").write_text("a user's file\n")
    return _tree(directory)


# ---------------------------------------------------------------- own nothing you did not make


def test_pack_refuses_a_directory_that_is_not_a_pack(work: Path) -> None:
    mine = _mine(work / "mine")
    result = run_cli(work, "pack", "--config", "c.yaml", "--out", "mine")
    assert result.returncode == 2
    assert_one_line_error(result, "data pack output mine exists and is not a data pack",
                          "pass a new path or remove it by hand")
    assert _tree(work / "mine") == mine
    assert not [n for n in entries(work) if n.startswith(".mine")]  # no temporary sibling


def test_pack_refuses_a_file_where_its_directory_goes(work: Path) -> None:
    (work / "blocker").write_text("keep\n")
    result = run_cli(work, "pack", "--config", "c.yaml", "--out", "blocker")
    assert result.returncode == 2
    assert_one_line_error(result, "--out blocker is a file, not a directory")
    assert (work / "blocker").read_text() == "keep\n"


def test_pack_replaces_its_own_pack(work: Path) -> None:
    before = json.loads((work / "data" / "metadata.json").read_text())["data_id"]
    result = run_cli(work, "pack", "--config", "c.yaml", "--out", "data")
    assert result.returncode == 0, result.stderr
    assert json.loads((work / "data" / "metadata.json").read_text())["data_id"] == before
    assert not [n for n in entries(work) if n.startswith((".data.tmp", ".data.old"))]


def test_train_into_a_directory_that_is_not_a_snapshot_refuses_before_training(
        work: Path) -> None:
    mine = _mine(work / "mine")
    before = entries(work)
    result = run_cli(work, "train", "--config", "c.yaml", "--data", "data", "--resume-from",
                     "none", "--until-step", "4", "--out", "mine", "--no-track")
    assert result.returncode == 2
    assert_one_line_error(result, "snapshot output mine already exists and is not a valid "
                                  "snapshot", "remove it by hand or choose another output path")
    assert "step 1" not in result.stderr and "segment" not in result.stderr  # nothing trained
    assert entries(work) == before  # no train/ nor tensorboard/ in the working directory
    assert _tree(work / "mine") == mine


def test_export_and_compare_refuse_a_directory_they_did_not_write(work: Path) -> None:
    mine = _mine(work / "mine")
    export = run_cli(work, "export", "--snapshot", SNAPSHOT, "--out", "mine")
    assert export.returncode == 2
    assert_one_line_error(export, "export directory mine exists and is not a loopline export")
    compare = run_cli(work, "compare", "results/r", "--out", "mine")
    assert compare.returncode == 2
    assert_one_line_error(compare, "compare output mine exists and is not a comparison")
    assert _tree(work / "mine") == mine


def test_heff_into_a_directory_is_refused_before_the_sweep(work: Path) -> None:
    (work / "out.json").mkdir()
    result = run_cli(work, "heff", "--snapshot", SNAPSHOT, "--data", "data", "--out",
                     "out.json", "--no-track")
    assert result.returncode == 2
    assert_one_line_error(result, "--out out.json is a directory, not a file")
    assert "H_eff sweep of" not in result.stderr
    assert entries(work / "out.json") == []


# ---------------------------------------------------------------- a broken or lost store


def _heff(work: Path) -> object:
    return run_cli(work, "heff", "--snapshot", SNAPSHOT, "--data", "data", "--out",
                   "results/r/eval/heff/step_0000004.json")


def test_a_moved_store_is_one_line_before_the_work_and_no_fresh_store(work: Path) -> None:
    (work / "results" / "mlflow.db").rename(work / "moved.db")
    before = _tree(work / "results")
    result = _heff(work)
    assert result.returncode == 2
    line = assert_one_line_error(result, f"tracking store {work / 'results' / 'mlflow.db'} is "
                                         "missing", "results/r/tracking.json names parent run",
                                 "track-init --run-dir results/r", "sync-tracking")
    assert "H_eff sweep of" not in result.stderr, line  # the work did not start
    assert _tree(work / "results") == before  # no fresh store, no result, no outbox


def test_re_creating_the_store_with_track_init_says_so_and_the_stage_runs(work: Path) -> None:
    (work / "results" / "mlflow.db").unlink()
    old = json.loads((work / "results" / "r" / "tracking.json").read_text())["parent_run_id"]
    init = run_cli(work, "track-init", "--config", "c.yaml", "--run-dir", "results/r",
                   "--data", "data")
    assert init.returncode == 0, init.stderr
    new = json.loads((work / "results" / "r" / "tracking.json").read_text())["parent_run_id"]
    assert new != old and f"had no parent run {old}" in init.stderr
    assert _heff(work).returncode == 0


@pytest.mark.parametrize("content", [b"", b"not a database\n"], ids=["emptied", "garbage"])
def test_an_emptied_or_garbage_store_is_one_line_before_the_work(work: Path,
                                                                 content: bytes) -> None:
    db = work / "results" / "mlflow.db"
    db.write_bytes(content)
    before = _tree(work / "results")
    result = _heff(work)
    assert result.returncode == 2
    text = "is empty" if not content else "is not a SQLite database"
    assert_one_line_error(result, f"tracking store {db} {text}", "track-init")
    assert _tree(work / "results") == before


def test_a_deleted_and_re_created_store_is_named_so_with_fixes_that_lose_nothing(
        work: Path, tracked: Path) -> None:
    """The store file deleted, then a new one made at its path (MLflow makes one on first
    open; here with another experiment first, so the ids differ): the line says the old
    store is gone and a new one took its place, and never to put a file back over the new
    one, which may already hold runs made since (issue 39, class 9)."""
    from mlflow import MlflowClient

    db = work / "results" / "mlflow.db"
    db.unlink()
    MlflowClient(f"sqlite:///{db}").create_experiment("something-else")
    before = _tree(work / "results" / "r")
    result = _heff(work)
    assert result.returncode == 2
    line = assert_one_line_error(
        result, f"tracking store {db} is not the store results/r/tracking.json was written "
        "against: it holds no experiment 1 ('loopline-default'); that store was deleted or "
        f"moved, and a new one was made at {db} since; to go back to it, move the new file "
        "aside (it may hold runs made since) and put the old one back, or to start over in "
        "the new store run `python -m pipeline_lib track-init --run-dir results/r")
    assert "reset" not in line and "restore the file" not in line
    assert _tree(work / "results" / "r") == before


def test_a_deleted_parent_run_is_recreated_and_said(work: Path) -> None:
    from mlflow import MlflowClient

    info_path = work / "results" / "r" / "tracking.json"
    old = json.loads(info_path.read_text())["parent_run_id"]
    MlflowClient(f"sqlite:///{work / 'results' / 'mlflow.db'}").delete_run(old)
    result = _heff(work)
    assert result.returncode == 0, result.stderr
    new = json.loads(info_path.read_text())["parent_run_id"]
    assert new != old
    assert f"parent run {old} of r is not in" in result.stderr
    assert f"created parent run {new}" in result.stderr


# ---------------------------------------------------------------- the run's tracking files


@pytest.mark.parametrize("name", ["tracking.json", "tracking_files", "tracking_outbox.jsonl"])
def test_a_tracking_file_of_the_wrong_kind_is_one_line_before_the_work(work: Path,
                                                                       name: str) -> None:
    """A directory where tracking.json or the outbox goes, a file where tracking_files/
    goes: one line naming it, before the sweep (issue 39, class 9: a traceback before)."""
    path = work / "results" / "r" / name
    if path.is_dir():
        shutil.rmtree(path)
        path.write_text("")
        found, wanted = "a file", "a directory"
    else:
        path.unlink(missing_ok=True)
        path.mkdir()
        found, wanted = "a directory", "a file"
    before = _tree(work / "results")
    result = _heff(work)
    assert result.returncode == 2
    assert_one_line_error(result, f"results/r/{name} is {found}, where loopline's tracking "
                                  f"keeps {wanted}; move it aside and rerun")
    assert "H_eff sweep of" not in result.stderr
    assert _tree(work / "results") == before


def test_tracking_files_on_a_read_only_disk_are_one_line_before_the_work(work: Path) -> None:
    """The run's tracking_files/ on a read-only mount (the sweep's own output elsewhere):
    refused before the sweep; the stage used to compute it, then fail on headline.json."""
    import subprocess

    folder = work / "results" / "r" / "tracking_files"
    mounted = subprocess.run(f"mount --bind '{folder}' '{folder}' && mount -o remount,bind,ro "
                             f"'{folder}'", shell=True, capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {mounted.stderr.strip()}")
    try:
        result = run_cli(work, "heff", "--snapshot", SNAPSHOT, "--data", "data", "--out",
                         "sweep.json")
    finally:
        subprocess.run(["umount", str(folder)], check=False)
    assert result.returncode == 2
    assert_one_line_error(result, "results/r/tracking_files is on a read-only file system",
                          "tracking.enabled=false")
    assert "H_eff sweep of" not in result.stderr and not (work / "sweep.json").exists()


def test_an_unreadable_tracking_json_is_one_tracking_error_line(work: Path) -> None:
    """chmod 000 on tracking.json (as root, the check runs as nobody, in a copy under /tmp:
    the test's own folder is root-only): the store check raises the one-line TrackingError,
    where a bare PermissionError was a traceback in a Snakemake job's log."""
    import os
    import subprocess
    import sys
    import tempfile

    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv (util-linux) to drop privileges")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    root = Path(tempfile.mkdtemp(prefix="unreadable", dir="/tmp"))
    try:
        copy = Path(shutil.copytree(work, root / "work", symlinks=True))
        info = copy / "results" / "r" / "tracking.json"
        info.write_text(info.read_text().replace(str(work), str(copy)))
        for folder, _, names in os.walk(root):
            for entry in [folder, *(os.path.join(folder, n) for n in names)]:
                os.chown(entry, 65534, 65534)
        info.chmod(0o000)
        code = ("from pipeline_lib.spec.config_load import load_config\n"
                "from pipeline_lib.tracking.health import check_store\n"
                "check_store(load_config('c.yaml'), 'results/r')\n")
        result = subprocess.run([*(as_nobody if os.geteuid() == 0 else []), sys.executable,
                                 "-c", code], capture_output=True, text=True, cwd=copy,
                                timeout=120, env=command_env(copy))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "pipeline_lib.errors.TrackingError: results/r/tracking.json cannot be read and "
        "written by this user; fix its permissions (chmod u+rw), or turn tracking off "
        "(tracking.enabled=false; --no-track on the command line)")
