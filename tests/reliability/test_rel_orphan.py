"""Snakemake killed with SIGKILL while a segment job trains (a lost login session): the job
runs on, and the rerun trains no segment twice. A job that finished before the rerun is
adopted although the rerun deleted its output (taken for incomplete); a job still training
is waited for, then adopted. Every step is logged once, in metrics.jsonl and in MLflow, and
the killed workflow's lock on the results directory is taken over and let go at the end."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from support.workflow_runs import segment_pids, snakemake, start_snakemake, workflow_env

RUN = "loops2"
CONFIG = f"""
train: {{total_steps: 20, steps_per_segment: 10}}
snapshots: {{keep_last: 2}}
runs:
  {RUN}: {{model: {{loops: 2}}}}
"""
FAULT_SITE = Path(__file__).resolve().parents[1] / "support" / "fault_site"
WAIT_S = 600


def _faults(workdir: Path, inject: str) -> dict[str, str]:
    """Each segment job of this Snakemake call pauses as ``inject`` says (support/fault_site)."""
    path = os.pathsep.join(p for p in (str(FAULT_SITE), os.environ.get("PYTHONPATH", "")) if p)
    return workflow_env(workdir, PYTHONPATH=path, LOOPLINE_FAULT_INJECT=inject)


def _wait(what: str, ok, proc=None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not ok():
        assert proc is None or proc.poll() is None, f"snakemake ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _logs(workdir: Path, step: int) -> str:
    folder = workdir / "logs" / "train_segment" / RUN
    return "".join(p.read_text() for p in sorted(folder.glob(f"step_{step:07d}.attempt*.log")))


def _kill_snakemake_beside(workdir: Path, proc, marker: Path) -> int:
    """SIGKILL to Snakemake alone once its segment job reached ``marker``; the job's pid."""
    _wait(marker.name, marker.exists, proc)
    (job,) = segment_pids(workdir)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return job


def _unlock(workdir: Path, target: str) -> None:
    unlocked = snakemake(workdir, "--unlock", target,
                         extra_configs=(workdir / "orphan.yaml",))  # what a killed one left
    assert unlocked.returncode == 0, unlocked.stderr[-3000:]


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("orphan") / "wd"
    workdir.mkdir()
    (workdir / "orphan.yaml").write_text(CONFIG)
    try:
        yield _kill_twice(workdir)
    finally:  # nothing of this test outlives it, whatever failed
        for job in segment_pids(workdir):
            os.kill(job, signal.SIGKILL)


def _kill_twice(workdir: Path) -> dict:
    target = f"results/{RUN}/snapshots/step_0000020"
    args = ("--cores", "1", target)
    extra = (workdir / "orphan.yaml",)
    seen: dict = {"workdir": workdir}
    # 1. killed while segment 10 trains; its job finishes alone before the rerun
    first = start_snakemake(workdir, *args, extra_configs=extra, env=_faults(
        workdir, f"pause_step=5,pause_s=2,pause_file={workdir / 'paused1'}"))
    job = _kill_snakemake_beside(workdir, first, workdir / "paused1")
    _wait("the first orphan to finish", lambda: not Path(f"/proc/{job}").exists())
    _unlock(workdir, target)
    # 2. the rerun adopts segment 10; killed while segment 20 trains, whose job is held
    second = start_snakemake(workdir, *args, extra_configs=extra, env=_faults(
        workdir, f"pause_step=15,pause_s=2,pause_file={workdir / 'paused2'}"))
    seen["orphan"] = _kill_snakemake_beside(workdir, second, workdir / "paused2")
    os.kill(seen["orphan"], signal.SIGSTOP)  # still training when the next rerun starts
    seen["second"] = (workdir / "snakemake.1.log").read_text()
    _unlock(workdir, target)
    # 3. the rerun waits for the held job, which then goes on, and adopts segment 20
    third = start_snakemake(workdir, *args, extra_configs=extra)
    try:
        _wait("the rerun's job waiting", lambda: "waiting for it to end" in _logs(workdir, 20),
              third)
    finally:
        os.kill(seen["orphan"], signal.SIGCONT)
    seen["rc"] = third.wait(timeout=WAIT_S)
    seen["third"] = (workdir / "snakemake.2.log").read_text()
    return seen


@pytest.mark.slow
def test_the_rerun_finishes_and_takes_over_the_killed_workflows_lock(killed_twice) -> None:
    assert killed_twice["rc"] == 0, killed_twice["third"][-5000:]
    assert "in use by another workflow" not in killed_twice["second"] + killed_twice["third"]
    assert not (killed_twice["workdir"] / "results" / ".workflow_lock.json").exists()


@pytest.mark.slow
def test_no_segment_is_trained_twice(killed_twice) -> None:
    workdir = killed_twice["workdir"]
    for start, end in ((0, 10), (10, 20)):
        log = _logs(workdir, end)
        assert log.count(f"segment {start}→{end} done") == 1, log[-4000:]
        assert log.count("adopted its snapshot") == 1, log[-4000:]
    waited = _logs(workdir, 20)
    assert f"is being trained by process {killed_twice['orphan']} on " in waited


@pytest.mark.slow
def test_every_step_logged_once(killed_twice) -> None:
    run = killed_twice["workdir"] / "results" / RUN
    steps = [json.loads(x)["step"] for x in (run / "train" / "metrics.jsonl").read_text()
             .splitlines()]
    assert steps == list(range(1, 21))
    from mlflow.tracking import MlflowClient

    state = json.loads((run / "snapshots" / "step_0000020" / "trainer_state.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{run.parent / 'mlflow.db'}")
    history = client.get_metric_history(state["tracking_run_id"], "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 21))
