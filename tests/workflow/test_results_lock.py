"""One workflow at a time on a results directory (pipeline_lib.workflow.results_lock), with
real Snakemake runs: a workflow of another working directory naming the same
experiment.results_dir is refused in one line naming the first one's host, pid and working
directory, before any job and without rewriting the run specs; a second call from the same
working directory with other outputs runs beside it (Snakemake's own lock decides); a dry
run takes nothing; the lock goes when the workflow ends; onstart's file problems are one
line each."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
from support.workflow_runs import segment_pids, snakemake, start_snakemake

CONFIG = """
train: {total_steps: 10, steps_per_segment: 10}
runs:
  loops1: {model: {loops: 1}}
  loops2: {model: {loops: 2}}
"""
TARGET = "results/loops2/snapshots/step_0000010"
READY = "results/loops1/tracking_files/tracking_ready.json"  # loops1's track_init: no overlap
WAIT_S = 600


def _errors(result) -> list[str]:
    out = result.stdout + result.stderr
    assert "Traceback" not in out, out[-3000:]
    return [line for line in out.splitlines() if line.startswith("error: ")]


def _started_jobs(result) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines()
            if line.startswith(("rule ", "localrule "))]


def _lock_record(results: Path) -> dict | None:
    path = results / ".workflow_lock.json"
    return json.loads(path.read_text()) if path.is_file() else None


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("results_lock")
    first, other = root / "first", root / "other"
    for workdir in (first, other):
        workdir.mkdir()
    (first / "c.yaml").write_text(CONFIG)
    results = first / "results"
    (other / "c.yaml").write_text(CONFIG + f"experiment: {{results_dir: {str(results)!r}}}\n")
    # the pack and the store first: a second call of this directory reads them, so they must
    # not be outputs of the first call (Snakemake's own lock would refuse it)
    ready = snakemake(first, "--cores", "1", READY.replace("loops1", "loops2"),
                      extra_configs=(first / "c.yaml",))
    assert ready.returncode == 0, ready.stderr[-3000:]
    proc = start_snakemake(first, "--cores", "1", TARGET, extra_configs=(first / "c.yaml",))
    try:
        yield _beside(first, other, results, proc)
    finally:  # nothing of this test outlives it, whatever failed
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for job in segment_pids(first):
            os.kill(job, signal.SIGKILL)


def _specs(run_dir: Path) -> dict[str, int]:
    """The run's spec files (``specs/{digest}.yaml``) and when each was last written."""
    return {p.name: p.stat().st_mtime_ns for p in sorted((run_dir / "specs").glob("*.yaml"))}


def _beside(first: Path, other: Path, results: Path, proc) -> dict:
    deadline = time.monotonic() + WAIT_S
    while not segment_pids(first):  # the workflow is under way: its segment job trains
        assert proc.poll() is None, (first / "snakemake.0.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "timed out waiting for the segment job"
        time.sleep(0.05)
    (job,) = segment_pids(first)
    os.kill(job, signal.SIGSTOP)  # held while the others try
    seen = {"first": first, "pid": proc.pid, "results": results,
            "spec": _specs(results / "loops2")}
    try:
        seen["other"] = snakemake(other, "--cores", "1", extra_configs=(other / "c.yaml",))
        seen["spec_after"] = _specs(results / "loops2")
        seen["lock"] = _lock_record(results)
        seen["dry"] = snakemake(other, "-n", extra_configs=(other / "c.yaml",))
        seen["same_dir"] = snakemake(first, "--cores", "1", READY,
                                     extra_configs=(first / "c.yaml",))
        seen["lock_after"] = _lock_record(results)
    finally:
        os.kill(job, signal.SIGCONT)
    seen["rc"] = proc.wait(timeout=WAIT_S)
    return seen


@pytest.mark.slow
def test_another_working_directory_is_refused_in_one_line(side_by_side: dict) -> None:
    other, first = side_by_side["other"], side_by_side["first"]
    assert other.returncode != 0
    (line,) = _errors(other)
    assert line.startswith(
        f"error: results directory {side_by_side['results']} is in use by another workflow: "
        f"Snakemake process {side_by_side['pid']} on host {socket.gethostname()} in working "
        f"directory {first} (since ")
    assert "give it another experiment.results_dir" in line
    assert not _started_jobs(other)  # refused before any job
    assert side_by_side["spec"]  # the running call's spec, written before its first job
    assert side_by_side["spec_after"] == side_by_side["spec"]  # the run specs left alone


@pytest.mark.slow
def test_a_dry_run_takes_nothing(side_by_side: dict) -> None:
    assert side_by_side["dry"].returncode == 0, side_by_side["dry"].stderr[-3000:]


@pytest.mark.slow
def test_the_same_working_directory_runs_beside_it(side_by_side: dict) -> None:
    same = side_by_side["same_dir"]
    assert same.returncode == 0, same.stderr[-3000:]
    assert (side_by_side["first"] / READY).is_file()
    assert side_by_side["lock"] is not None
    holders = side_by_side["lock"]["holders"]
    assert [(h["pid"], h["workdir"]) for h in holders] == \
        [(side_by_side["pid"], str(side_by_side["first"]))]
    assert side_by_side["lock_after"] == side_by_side["lock"]  # the second one let go


@pytest.mark.slow
def test_the_lock_goes_when_the_workflow_ends(side_by_side: dict) -> None:
    assert side_by_side["rc"] == 0, (side_by_side["first"] / "snakemake.0.log").read_text()
    assert not (side_by_side["results"] / ".workflow_lock.json").exists()


@pytest.mark.slow
def test_onstart_file_problems_are_one_line(side_by_side: dict) -> None:
    first, results = side_by_side["first"], side_by_side["results"]
    lock = results / ".workflow_lock.json"
    (spec,) = (results / "loops1" / "specs").glob("*.yaml")
    lock.mkdir()
    try:
        result = snakemake(first, "--cores", "1", extra_configs=(first / "c.yaml",))
        assert _errors(result) == [f"error: the workflow lock {lock} is a directory, not a "
                                   "file: move it away (or remove it if it holds nothing of "
                                   "yours) and rerun"]
    finally:
        lock.rmdir()
    spec.unlink()
    spec.mkdir()
    result = snakemake(first, "--cores", "1", extra_configs=(first / "c.yaml",))
    (line,) = _errors(result)
    assert line.startswith("error: cannot write ") and line.endswith(
        f"Is a directory; {spec} is a directory where a file belongs: move it away, then rerun")
    assert not _started_jobs(result) and not lock.exists()  # nothing ran; the lock let go
