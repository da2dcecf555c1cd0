"""The run's training lease (pipeline_lib.train.lease): a second job training the same run
at once is refused in one line; a gone holder is taken over; the lease goes with its job."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.errors import TrainingError
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.train.lease import holder_alive, run_lease


def _lease(run_dir: Path) -> Path:
    return RunLayout.at(run_dir).lease


def test_held_while_training_and_gone_after(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    with run_lease(run, 20) as mine:
        held = json.loads(_lease(run).read_text())
        assert held == mine and held["pid"] == os.getpid() and held["until_step"] == 20
    assert not _lease(run).exists()


def test_released_when_the_job_fails(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    with pytest.raises(RuntimeError), run_lease(run, 20):
        raise RuntimeError("the segment failed")
    assert not _lease(run).exists()


def test_a_live_holder_refuses_a_second_job_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _lease(run).parent.mkdir(parents=True)
        _lease(run).write_text(json.dumps({"slurm_job_id": None, "pid": holder.pid,
                                           "host": socket.gethostname(), "until_step": 30,
                                           "since": "2026-12-02 08:00:00"}))
        with pytest.raises(TrainingError) as info, run_lease(run, 30):
            pytest.fail("a second job trained beside a live one")
        message = str(info.value)
        assert "\n" not in message
        assert f"run loop4 is being trained by process {holder.pid}" in message
        assert f"kill {holder.pid}" in message and "lease.json" in message
        assert json.loads(_lease(run).read_text())["pid"] == holder.pid  # left as it was
    finally:
        holder.kill()
        holder.wait()


def test_a_gone_holder_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _lease(run).parent.mkdir(parents=True)
    _lease(run).write_text(json.dumps({"slurm_job_id": None, "pid": int(gone.stdout),
                                       "host": socket.gethostname(), "until_step": 30}))
    with run_lease(run, 30) as mine:
        assert json.loads(_lease(run).read_text()) == mine
    assert not _lease(run).exists()


def test_a_requeued_slurm_job_takes_its_own_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # SLURM keeps the id of a requeued job
    assert not holder_alive({"slurm_job_id": "4242", "pid": 1, "host": "elsewhere"})


def test_a_process_on_another_host_counts_as_running() -> None:
    assert holder_alive({"slurm_job_id": None, "pid": 1, "host": "another-node"})


def test_a_job_that_wrote_nothing_leaves_no_folder(tmp_path: Path) -> None:
    run = tmp_path / "new" / "loop4"
    with pytest.raises(RuntimeError), run_lease(run, 20):
        raise RuntimeError("a bad input, refused before any work")
    assert not (tmp_path / "new").exists()
    with run_lease(run, 20):
        (RunLayout.at(run).train_dir / "metrics.jsonl").write_text("{}\n")
    assert (RunLayout.at(run).train_dir / "metrics.jsonl").exists()  # what the job wrote stays
