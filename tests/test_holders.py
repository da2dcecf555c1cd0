"""Lock files naming their holders (pipeline_lib.holders): whether a holder runs (a reused
pid is another process), changes by compare-and-swap (two takers of a stale lock never both
win, real processes racing), and file problems as one line naming the path and the fix."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from pipeline_lib.errors import PipelineError
from pipeline_lib.holders import (
    ALIVE,
    GONE,
    UNKNOWN,
    HolderFile,
    process_start,
    process_state,
    this_process,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _holder(pid: int, started: str | None) -> dict:
    return {"host": socket.gethostname(), "pid": pid, "started": started}


def test_a_holder_runs_while_its_process_runs_with_the_recorded_start() -> None:
    assert process_state(this_process()) == ALIVE
    live = subprocess.Popen(SLEEPER)
    try:
        time.sleep(0.1)
        assert process_state(_holder(live.pid, process_start(live.pid))) == ALIVE
        # the same pid with another start time: the pid was reused, the holder is gone
        assert process_state(_holder(live.pid, "another-boot:12")) == GONE
    finally:
        live.kill()
    os.waitid(os.P_PID, live.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped: a zombie
    assert process_state(_holder(live.pid, None)) == GONE
    live.wait()
    assert process_state(_holder(live.pid, None)) == GONE
    assert process_state({"host": "another-node", "pid": 1}) == UNKNOWN


_RACER = """
import json, sys, time
from pathlib import Path
from pipeline_lib.errors import PipelineError
from pipeline_lib.holders import GONE, HolderFile, process_state, this_process
path, go = Path(sys.argv[1]), Path(sys.argv[2])
me = this_process()
while not go.exists():
    time.sleep(0.001)
lock = HolderFile(path, "test lock", PipelineError)
now = lock.change(lambda rec: me if rec is None or process_state(rec) == GONE else rec)
print("won" if now == me else "lost", flush=True)
time.sleep(1.5)  # stays alive while the others decide
"""


@pytest.mark.parametrize("round_", range(3))
def test_two_takers_of_a_stale_lock_never_both_win(tmp_path: Path, round_: int) -> None:
    path, go = tmp_path / "lock.json", tmp_path / "go"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    path.write_text(json.dumps(_holder(int(gone.stdout), None)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, str(path), str(go)],
                               stdout=subprocess.PIPE, text=True, env=env) for _ in range(6)]
    time.sleep(1.0)  # every racer started and waits for the go
    go.touch()
    said = [r.communicate(timeout=120)[0].strip() for r in racers]
    assert sorted(said) == ["lost"] * 5 + ["won"], said
    assert not list(tmp_path.glob("*.claim-*")) and not list(tmp_path.glob(".*.tmp"))


def test_a_release_never_removes_a_record_it_did_not_write(tmp_path: Path) -> None:
    lock = HolderFile(tmp_path / "lock.json", "test lock", PipelineError)
    mine, theirs = this_process(), {**this_process(), "pid": 1}
    lock.change(lambda rec: theirs)
    assert lock.change(lambda rec: None if rec == mine else rec) == theirs
    assert json.loads(lock.path.read_text()) == theirs
    assert lock.change(lambda rec: None) is None and not lock.path.exists()


def _error(path: Path, action) -> str:
    with pytest.raises(PipelineError) as info:
        action(HolderFile(path, "test lock", PipelineError))
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_directory_or_a_foreign_file_in_its_place_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "lock.json").mkdir()
    message = _error(tmp_path / "lock.json", lambda lock: lock.change(lambda rec: {"a": 1}))
    assert "is a directory, not a file: move it away" in message
    (tmp_path / "other.json").write_text("[1, 2]")
    message = _error(tmp_path / "other.json", lambda lock: lock.read())
    assert "is not a record loopline wrote" in message and "delete it and rerun" in message


def test_a_claim_left_by_a_killed_process_is_named_with_the_fix(tmp_path: Path) -> None:
    lock = HolderFile(tmp_path / "lock.json", "test lock", PipelineError)
    lock.change(lambda rec: {"holder": "gone"})
    st = os.stat(lock.path)
    claim = tmp_path / f"lock.json.claim-{st.st_ino}-{st.st_mtime_ns}"
    claim.write_text("{}")  # what a process killed inside its compare-and-swap leaves
    message = _error(lock.path, lambda lock: lock.change(lambda rec: {"holder": "me"}))
    assert f"delete {claim} and rerun" in message


def _as_nobody(code: str, cwd: Path) -> subprocess.CompletedProcess:
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv (util-linux) to drop privileges")
    prefix = (["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
              if os.geteuid() == 0 else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


_PROBE = """
import sys
from pathlib import Path
from pipeline_lib.errors import PipelineError
from pipeline_lib.holders import HolderFile
try:
    HolderFile(Path(sys.argv[1]), "test lock", PipelineError).change(lambda rec: {"me": 1})
except PipelineError as exc:
    print(f"error: {exc}")
    sys.exit(2)
"""


def test_an_unreadable_lock_is_one_line(tmp_path: Path) -> None:
    """chmod 000 stops only other users: as root, the probe runs as nobody (uid 65534)."""
    root = Path(tempfile.mkdtemp(prefix="holders", dir="/tmp"))  # tmp_path is root-only
    try:
        os.chmod(root, 0o777)
        (root / "lock.json").write_text("{}")
        os.chmod(root / "lock.json", 0o000)
        done = _as_nobody(_PROBE.replace("sys.argv[1]", repr(str(root / "lock.json"))), root)
        assert done.returncode == 2, done.stderr
        assert done.stdout == (f"error: cannot read the test lock {root / 'lock.json'}: "
                               f"Permission denied; give this user read and write access to "
                               f"{root} and the files in it, then rerun\n")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_lock_on_a_read_only_file_system_is_one_line(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"]).returncode != 0:
        pytest.skip("needs unshare -rm (user and mount namespaces) to mount a read-only tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(_PROBE)
    script = (f'mount -t tmpfs tmpfs "{disk}" && mkdir "{disk}/run" && '
              f'mount -o remount,ro "{disk}" || exit 99; '
              f'"{sys.executable}" "{probe}" "{disk}/run/lock.json"')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([unshare, "-rm", "sh", "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    if done.returncode == 99:
        pytest.skip("cannot mount a read-only tmpfs in a user namespace here")
    assert done.returncode == 2, done.stderr
    assert done.stdout.startswith(f"error: cannot write the test lock {disk}/run/lock.json: "
                                  "Read-only file system; the results directory must be on a "
                                  "writable file system (experiment.results_dir)")
    assert done.stdout.count("\n") == 1 and "Traceback" not in done.stderr
