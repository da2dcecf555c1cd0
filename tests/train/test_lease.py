"""The run's training lease (pipeline_lib.train.lease): a second job of a run waits for a
live holder and then takes the lease; a gone holder (a reused pid too) is taken over, by one
of several racing jobs at a time; a holder nothing here can check is refused in one line
that says how to proceed if it is gone; the lease goes with its job."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pipeline_lib.errors import TrainingError
from pipeline_lib.holders import GONE, UNKNOWN, process_start
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.train import preempt
from pipeline_lib.train.lease import holder_state, run_lease

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def _lease(run_dir: Path) -> Path:
    return RunLayout.at(run_dir).lease


def _write_lease(run: Path, **holder) -> None:
    _lease(run).parent.mkdir(parents=True, exist_ok=True)
    _lease(run).write_text(json.dumps({"slurm_job_id": None, "host": socket.gethostname(),
                                       "until_step": 30, "since": "2026-12-02 08:00:00",
                                       **holder}))


def test_held_while_training_and_gone_after(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    segment = {"input": "snapshots/step_0000010", "signature": "abc", "out": "x"}
    with run_lease(run, 20, segment) as mine:
        held = json.loads(_lease(run).read_text())
        assert held == mine and held["pid"] == os.getpid() and held["until_step"] == 20
        assert held["started"] == process_start(os.getpid()) and held["signature"] == "abc"
    assert not _lease(run).exists()


def test_released_when_the_job_fails(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    with pytest.raises(RuntimeError), run_lease(run, 20):
        raise RuntimeError("the segment failed")
    assert not _lease(run).exists()


_HOLDER = """
import sys, time
from pathlib import Path
from pipeline_lib.train.lease import run_lease
with run_lease(Path(sys.argv[1]), 30):
    print("held", flush=True)
    sys.stdin.readline()  # until the test lets go
"""


def test_a_second_job_waits_for_a_live_holder_then_takes_the_lease(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "loop4"
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], env=ENV,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    # the holder lets go once this job is seen waiting
    threading.Thread(target=_let_go_when_waited_for, args=(holder, caplog), daemon=True).start()
    with caplog.at_level(logging.WARNING), run_lease(run, 30) as mine:
        assert holder.poll() is not None  # never both at once
        assert json.loads(_lease(run).read_text()) == mine
    waited = [r.getMessage() for r in caplog.records if "waiting for it to end" in r.message]
    assert len(waited) == 1
    assert (f"run loop4 is being trained by process {holder.pid} on {socket.gethostname()} "
            "(segment to step 30") in waited[0]
    assert f"`kill {holder.pid} (on {socket.gethostname()})`" in waited[0]


def _let_go_when_waited_for(holder: subprocess.Popen, caplog: pytest.LogCaptureFixture) -> None:
    while not any("waiting for it to end" in r.getMessage() for r in caplog.records):
        threading.Event().wait(0.05)
    holder.stdin.close()
    holder.wait()


_RACER = """
import sys, time
from pathlib import Path
from pipeline_lib.train.lease import run_lease
run, go, log = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
while not go.exists():
    time.sleep(0.001)
with run_lease(run, 30):
    with open(log, "a") as fh:
        fh.write("in\\n")
    time.sleep(0.3)
    with open(log, "a") as fh:
        fh.write("out\\n")
"""


def test_jobs_racing_for_a_stale_lease_train_one_at_a_time(tmp_path: Path) -> None:
    run, go, log = tmp_path / "loop4", tmp_path / "go", tmp_path / "log"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _write_lease(run, pid=int(gone.stdout))  # a killed job's lease
    jobs = [subprocess.Popen([sys.executable, "-c", _RACER, str(run), str(go), str(log)],
                             env=ENV, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    threading.Event().wait(1.0)  # every job started and waits for the go
    go.touch()
    errors = [job.communicate(timeout=300)[1] for job in jobs]
    assert [job.returncode for job in jobs] == [0] * 4, errors
    assert log.read_text() == "in\nout\n" * 4  # one after the other, never two at once
    assert not _lease(run).exists()


def test_a_gone_holder_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    _write_lease(run, pid=int(gone.stdout))
    with run_lease(run, 30) as mine:
        assert json.loads(_lease(run).read_text()) == mine
    assert not _lease(run).exists()


def test_a_pid_reused_by_another_process_is_taken_over(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # the recorded holder started at another time: this live pid is someone else
        _write_lease(run, pid=other.pid, started="another-boot:12")
        with run_lease(run, 30) as mine:
            assert json.loads(_lease(run).read_text()) == mine
        assert other.poll() is None  # nobody was told to kill it, nor waited for
    finally:
        other.kill()
        other.wait()


def test_a_holder_on_another_host_is_refused_with_the_way_out(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    _write_lease(run, host="node-gone", pid=4321)
    with pytest.raises(TrainingError) as info, run_lease(run, 30):
        pytest.fail("a second job trained beside one nothing could check")
    message, path = str(info.value), _lease(run)
    assert "\n" not in message
    assert message.startswith("run loop4 is being trained by process 4321 on node-gone "
                              f"(segment to step 30, since 2026-12-02 08:00:00; lease {path}), "
                              "which cannot be checked from")
    assert "stop it with `kill 4321 (on node-gone)`, then rerun" in message
    assert message.endswith(f"if it is gone (its host is down, the job was killed), delete "
                            f"{path} and rerun")
    assert json.loads(path.read_text())["host"] == "node-gone"  # left as it was


def test_a_stop_signal_while_waiting_ends_the_wait_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    previous = {sig: signal.getsignal(sig) for sig in preempt.STOP_SIGNALS}
    try:
        _write_lease(run, pid=holder.pid, started=process_start(holder.pid))
        preempt.latch_stop_signals()  # as the segment job does first thing
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        with pytest.raises(TrainingError) as info, run_lease(run, 30):
            pytest.fail("trained beside a live holder")
        assert str(info.value).startswith(f"stopped while waiting for process {holder.pid} on ")
        assert "rerun the job once it has ended" in str(info.value)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        preempt._latched["reason"] = None
        holder.kill()
        holder.wait()


def test_a_requeued_slurm_job_takes_its_own_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # SLURM keeps the id of a requeued job
    assert holder_state({"slurm_job_id": "4242", "pid": 1, "host": "elsewhere"}) == GONE


def test_a_process_on_another_host_cannot_be_judged_from_here() -> None:
    assert holder_state({"slurm_job_id": None, "pid": 1, "host": "another-node"}) == UNKNOWN


def test_a_lease_path_that_is_a_directory_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    _lease(run).mkdir(parents=True)
    with pytest.raises(TrainingError) as info, run_lease(run, 30):
        pytest.fail("trained without a lease")
    assert str(info.value) == (f"the training lease {_lease(run)} is a directory, not a file: "
                               "move it away (or remove it if it holds nothing of yours) "
                               "and rerun")


def test_a_job_that_wrote_nothing_leaves_no_folder(tmp_path: Path) -> None:
    run = tmp_path / "new" / "loop4"
    with pytest.raises(RuntimeError), run_lease(run, 20):
        raise RuntimeError("a bad input, refused before any work")
    assert not (tmp_path / "new").exists()
    with run_lease(run, 20):
        (RunLayout.at(run).train_dir / "metrics.jsonl").write_text("{}\n")
    assert (RunLayout.at(run).train_dir / "metrics.jsonl").exists()  # what the job wrote stays
