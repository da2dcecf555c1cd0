"""The pipeline under a real SLURM cluster (scripts/slurm_local.sh: slurmctld, slurmd,
slurmdbd + mariadb on this machine, two partitions, an account), as a cluster user runs it:
``snakemake --profile profiles/slurm``.

One module, one workdir, the steps in order (each a defect a real scheduler showed):
Ctrl-C during the first local rules, then a run whose segments are signalled (SIGUSR1,
SIGTERM to the job's steps as at a preemption, ``scontrol requeue``), then ``kill -9`` of
Snakemake while a segment runs and an immediate rerun (which waits for the old job and adopts
its segment), then the run that finishes; in a
second workdir, a segment that outlasts its time limit. The end: weights, H_eff results and
depth_check.json identical to the same config run locally, every MLflow step exactly once,
every job in the configured partition and account with the configured resources. And a
cluster without accounting fails in one line naming the fix.

Where the cluster cannot be brought up (not root, no apt), the module is skipped with the
script's reason; ``make test`` prints it (``-ra``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.slurm_cluster import (
    CANNOT,
    RUN,
    cluster,
    job_env,
    job_state,
    jobs_named,
    run_config,
    running_job,
    sacct,
    wait_gone,
    was_up,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = ROOT / "config" / "experiments" / "tiny.yaml"
FAULT_SITE = Path(__file__).resolve().parents[1] / "support" / "fault_site"
SEGMENT, STEPS = 8, 32
PREFIX = f"lltest{os.getpid()}"


CONFIG = run_config(STEPS, SEGMENT)  # four segments, each signalled differently


def _command(workdir: Path, *extra: str, slurm: bool = True, prefix: str = PREFIX) -> list[str]:
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(TINY), str(workdir / "slurm.yaml")]
    if slurm:  # the profile as users give it; only the first status check comes sooner
        cmd += ["--profile", str(ROOT / "profiles" / "slurm"), "--slurm-jobname-prefix",
                prefix, "--slurm-init-seconds-before-status-checks", "2"]
    else:
        cmd += ["--cores", "2"]
    return cmd + list(extra)


def _start(workdir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    log = open(workdir / f"snakemake.{time.monotonic_ns()}.log", "w")  # noqa: SIM115
    return subprocess.Popen(_command(workdir, *extra), stdout=log, stderr=subprocess.STDOUT,
                            env=env or job_env(workdir), cwd=workdir, start_new_session=True,
                            preexec_fn=_as_from_a_terminal)


def _fault_env(workdir: Path, inject: str, **extra: str) -> dict[str, str]:
    """``job_env`` with support/fault_site on PYTHONPATH: each segment's trainer installs
    ``LOOPLINE_FAULT_INJECT=inject`` (only the first one, with ``LOOPLINE_TEST_FAULT_ONCE``
    in ``extra``)."""
    return {**job_env(workdir), "PYTHONPATH": os.pathsep.join(
        p for p in (str(FAULT_SITE), os.environ.get("PYTHONPATH", "")) if p),
        "LOOPLINE_FAULT_INJECT": inject, **extra}


def _as_from_a_terminal() -> None:
    """Ctrl-C reaches Snakemake as from a user's terminal, even when the tests themselves
    run in the background (a non-interactive shell starts background jobs with SIGINT
    ignored, and an ignored SIGINT is inherited: Snakemake would never see it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _finish(workdir: Path, *extra: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(_command(workdir, *extra), capture_output=True, text=True,
                          env=job_env(workdir), cwd=workdir, timeout=timeout)


def _workdir(tmp: Path, name: str, config: str = CONFIG) -> Path:
    workdir = tmp / name
    workdir.mkdir()
    (workdir / "slurm.yaml").write_text(config)
    return workdir


def _steps_logged(workdir: Path) -> int:
    metrics = workdir / "results" / RUN / "train" / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def _segment_log(workdir: Path, step: int) -> str:
    """Every attempt's log of the segment ending at ``step``."""
    folder = workdir / "logs" / "train_segment" / RUN
    return "".join(p.read_text() for p in sorted(folder.glob(f"step_{step:07d}.attempt*.log")))


def _wait(what: str, ok, proc: subprocess.Popen | None = None, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert proc is None or proc.poll() is None, f"snakemake ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory):
    """The cluster, without accounting first (the one-line failure), then with it."""
    started = not was_up()
    up = cluster("up", "--no-accounting")
    if up.returncode == CANNOT:
        pytest.skip(f"no SLURM cluster here: {up.stderr.strip().splitlines()[-1]}")
    assert up.returncode == 0, up.stderr[-3000:]
    workdir = _workdir(tmp_path_factory.mktemp("slurm"), "noacct")
    no_accounting = _finish(workdir, timeout=300)
    up = cluster("up")
    assert up.returncode == 0, up.stderr[-3000:]
    yield no_accounting
    if started:
        cluster("down")


def test_without_accounting_snakemake_fails_in_one_line(slurm) -> None:
    out = slurm.stdout + slurm.stderr
    assert slurm.returncode != 0
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out[-4000:]
    assert "--slurm-status-command squeue" in errors[0] and "sacct" in errors[0]
    assert "Traceback" not in out
    assert "submitted with SLURM" not in out  # it stopped before the first job


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same config run locally (--cores 2): what the cluster run must reproduce."""
    workdir = _workdir(tmp_path_factory.mktemp("slurm_local"), "local")
    done = subprocess.run(_command(workdir, slurm=False), capture_output=True, text=True,
                          env=job_env(workdir), cwd=workdir, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return workdir


def _signal_segment(workdir: Path, index: int, action: list[str], *,
                    requeued: bool = False) -> str:
    """When segment ``index`` (1-based) has done its first step: ``action + [job id]``; with
    ``requeued``, once SLURM has put the job back in the queue, start it at once rather than
    after SLURM's 120-s delay for requeued jobs."""
    first_step = (index - 1) * SEGMENT + 1
    _wait(f"step {first_step}", lambda: _steps_logged(workdir) >= first_step)
    job = running_job(f"_{RUN}_{index * SEGMENT:07d}")
    assert job is not None, f"no running job for segment {index}"
    subprocess.run([*action, job], check=True, timeout=60)
    if requeued:
        _wait(f"job {job} requeued", lambda: job_state(job) == "PENDING", timeout=300)
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True,
                       timeout=60)
    return job


@pytest.fixture(scope="module")
def cluster_run(slurm, local: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    workdir = _workdir(tmp_path_factory.mktemp("slurm_run"), "wd")
    seen: dict = {}
    # 1. Ctrl-C while the local rule track_init runs (after it wrote tracking.json)
    proc = _start(workdir)
    _wait("track_init", (workdir / "results" / RUN / "tracking.json").exists, proc)
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=300)
    # 2. a run whose segments are signalled one way each; its steps 2.. pause 0.5 s (same
    # numbers), so a signal sent once a segment's first step is logged finds it training (an
    # 8-step segment took 0.3 s here, and one once finished before its SIGUSR1 arrived)
    proc = _start(workdir, env=_fault_env(workdir, f"pause_step=2:{STEPS},pause_s=0.5"))
    seen["usr1"] = _signal_segment(workdir, 1, ["scancel", "--signal=USR1"])
    seen["term"] = _signal_segment(workdir, 2, ["scancel", "--signal=TERM"])
    seen["requeue"] = _signal_segment(workdir, 3, ["scontrol", "requeue"], requeued=True)
    # 3. the last segment's job held, Snakemake killed (a lost login session), a rerun at once:
    # its segment job waits for the held one, which then goes on; the rerun adopts its segment
    seen["orphan"] = _signal_segment(workdir, 4, ["scontrol", "suspend"])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    unlocked = _finish(workdir, "--unlock")  # what a killed Snakemake leaves: its lock
    assert unlocked.returncode == 0, unlocked.stderr[-3000:]
    rerun = _start(workdir)
    _wait("the rerun's segment job waiting",
          lambda: "waiting for it to end" in _segment_log(workdir, STEPS), rerun)
    subprocess.run(["scontrol", "resume", seen["orphan"]], check=True, timeout=60)
    seen["rerun"] = rerun.wait(timeout=900)
    seen["rerun_log"] = _segment_log(workdir, STEPS)
    wait_gone(seen["orphan"])
    # 4. the run that finishes
    seen["final"] = _finish(workdir)
    seen["workdir"] = workdir
    return seen


def test_the_interrupted_run_finishes(cluster_run: dict) -> None:
    final = cluster_run["final"]
    assert final.returncode == 0, final.stdout[-5000:] + final.stderr[-3000:]


def test_a_rerun_beside_a_live_orphan_job_waits_for_it_and_adopts_its_segment(
        cluster_run: dict) -> None:
    log = cluster_run["rerun_log"]
    assert cluster_run["rerun"] == 0, log[-5000:]
    lease = [line for line in log.splitlines() if "is being trained by SLURM job" in line]
    assert lease, log[-5000:]
    assert f"`scancel {cluster_run['orphan']}`" in lease[0]
    assert log.count(f"segment {STEPS - SEGMENT}→{STEPS} done") == 1  # the orphan's own
    assert log.count("adopted its snapshot") == 1  # the rerun's job trained nothing


def _bytes(path: Path) -> bytes:
    return path.read_bytes()


def test_results_identical_to_the_local_run(cluster_run: dict, local: Path) -> None:
    wd = cluster_run["workdir"]
    final = Path("results") / RUN / "snapshots" / f"step_{STEPS:07d}"
    assert _bytes(wd / final / "model.safetensors") == _bytes(local / final / "model.safetensors")
    heff = Path("results") / RUN / "eval" / "heff" / f"step_{STEPS:07d}.json"
    assert json.loads(_bytes(wd / heff))["losses"] == json.loads(_bytes(local / heff))["losses"]
    depth = Path("results") / "compare" / "depth_check.json"
    assert _bytes(wd / depth) == _bytes(local / depth)


def test_every_step_once_in_the_logs_and_in_mlflow(cluster_run: dict) -> None:
    wd = cluster_run["workdir"]
    metrics = wd / "results" / RUN / "train" / "metrics.jsonl"
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == \
        list(range(1, STEPS + 1))
    state = json.loads((wd / "results" / RUN / "snapshots" / f"step_{STEPS:07d}"
                        / "trainer_state.json").read_text())
    reasons = [p["reason"] for p in state["preemptions"]]
    assert "SIGUSR1" in reasons and "SIGTERM" in reasons, reasons
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'results' / 'mlflow.db'}")
    history = client.get_metric_history(state["tracking_run_id"], "train/loss")
    assert sorted(m.step for m in history) == list(range(1, STEPS + 1))


def test_every_job_in_the_configured_partition_and_account(cluster_run: dict) -> None:
    jobs = jobs_named(PREFIX)
    assert len({j.id for j in jobs}) >= 12, jobs  # pack, segments, index, sweeps, bench, …
    assert {(j.partition, j.account) for j in jobs} == {("train", "loopline")}, jobs
    # segments: train.segment_runtime_minutes and resources.train_*; the rest: eval_*
    expected = {"01:00:00": "3500M", "00:20:00": "3000M"}
    assert {(j.timelimit, j.req_mem, j.cpus) for j in jobs} == \
        {(limit, mem, 1) for limit, mem in expected.items()}, jobs
    assert {cluster_run[k] for k in ("usr1", "term", "requeue", "orphan")} <= \
        {j.id for j in jobs if j.timelimit == "01:00:00"}


def test_a_stopped_segment_exits_75_and_nothing_retries_inside_a_job(cluster_run: dict) -> None:
    usr1 = sacct("-D", "-j", cluster_run["usr1"])
    term = sacct("-D", "-j", cluster_run["term"])
    # the job's steps get the signal: the whole job exits 75; Snakemake resubmits it
    for key, instances in (("usr1", usr1), ("term", term)):
        assert any(j.id == cluster_run[key] and j.exit_code == "75:0" for j in instances), \
            instances
    for instances in (usr1, term):
        # one Snakemake step per allocation: no retry in the minutes the allocation had left
        steps = [j.id for j in instances if "." in j.id and not j.id.endswith(("batch", "extern"))]
        assert steps and all(s.endswith(".0") for s in steps), instances


def test_snakemake_inside_the_job_survives_sigusr1(cluster_run: dict) -> None:
    wd = cluster_run["workdir"]
    logs = list((wd / "logs" / "slurm").rglob(f"{cluster_run['usr1']}.log"))
    assert logs, "the SLURM log of the signalled job is kept"
    assert "User defined signal 1" not in logs[0].read_text()
    first = wd / "logs" / "train_segment" / RUN / "transient" / f"step_{SEGMENT:07d}.attempt1.log"
    assert "stopped: segment" in first.read_text()


def test_cluster_settings_are_the_cluster_profiles(cluster_run: dict) -> None:
    wd = cluster_run["workdir"]
    logs = list((wd / "logs" / "slurm").rglob("*.log"))
    assert logs, "successful jobs keep their SLURM logs"
    command = next(line for line in logs[0].read_text().splitlines() if "--latency-wait" in line)
    assert "--latency-wait 60" in command


def test_ctrl_c_during_the_local_rules_leaves_a_run_that_builds_everything(
        cluster_run: dict) -> None:
    wd = cluster_run["workdir"]
    second = sorted(wd.glob("snakemake.*.log"))[1].read_text()
    assert "1 of 1 steps (100%) done" not in second
    assert "rule train_segment" in second


# A segment that outlasts its time limit: SLURM itself ends it. SLURM counts limits in whole
# minutes and checks them every 30 s, so a 1-minute limit ends a job 60–90 s after it started
# (SIGTERM to every process of the job, SIGKILL KillWait = 20 s later). No stop margin: no
# early SIGUSR1 and no trainer clock, only the scheduler's SIGTERM. The first attempt of the
# segment pauses 10 s before each step (support/fault_site: a slow segment that computes the
# same numbers); the retry that resumes it runs at full speed.
TL_STEPS = 16
TL_CONFIG = run_config(TL_STEPS, TL_STEPS,
                    "\n  segment_runtime_minutes: 1\n  stop_margin_minutes: 0")
TL_PREFIX = PREFIX + "tl"
TL_TARGET = Path("results") / RUN / "snapshots" / f"step_{TL_STEPS:07d}"


@pytest.fixture(scope="module")
def time_limit_run(slurm, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("slurm_time_limit")
    local = _workdir(tmp, "local", TL_CONFIG)
    done = subprocess.run(_command(local, str(TL_TARGET), slurm=False), capture_output=True,
                          text=True, env=job_env(local), cwd=local, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    workdir = _workdir(tmp, "wd", TL_CONFIG)
    env = _fault_env(workdir, f"pause_step=1:{TL_STEPS},pause_s=10",
                     LOOPLINE_TEST_FAULT_ONCE=str(workdir / "slow_attempt_started"))
    run = subprocess.run(_command(workdir, str(TL_TARGET), prefix=TL_PREFIX),
                         capture_output=True, text=True, env=env, cwd=workdir, timeout=900)
    return {"local": local, "workdir": workdir, "run": run}


def test_a_segment_past_its_time_limit_resumes_where_slurm_stopped_it(
        time_limit_run: dict) -> None:
    run, wd = time_limit_run["run"], time_limit_run["workdir"]
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    assert (wd / "slow_attempt_started").exists()  # the first attempt was the slow one
    jobs = jobs_named(TL_PREFIX)
    segments = [j for j in jobs if j.timelimit == "00:01:00"]
    assert [j.state for j in segments] == ["TIMEOUT", "COMPLETED"], jobs
    state = json.loads((wd / TL_TARGET / "trainer_state.json").read_text())
    stops = [p for p in state["preemptions"] if p["reason"] == "SIGTERM"]
    assert len(stops) == 1 and 1 < stops[0]["step"] < TL_STEPS, state["preemptions"]
    metrics = wd / "results" / RUN / "train" / "metrics.jsonl"
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == \
        list(range(1, TL_STEPS + 1))
    local = time_limit_run["local"]
    assert _bytes(wd / TL_TARGET / "model.safetensors") == \
        _bytes(local / TL_TARGET / "model.safetensors")
