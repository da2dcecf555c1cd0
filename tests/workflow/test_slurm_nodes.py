"""A segment across two real SLURM nodes, and a node lost in the middle of one.

The cluster is scripts/slurm_nodes.sh's: slurmctld on this host, two slurmd (node1, node2),
each in its own network namespace with its own address and hostname, the file system shared
as NFS is on a cluster. A run of ``train.nnodes: 2, train.nproc: 1`` under
``--profile profiles/slurm``: each segment is one job of two nodes, ``srun`` starts one
torchrun per node, and they meet at the rendezvous the job derived from its allocation
(node1's address, port 20000 + job id mod 20000). In its second segment node2 is lost (its
slurmd and every process of its namespace killed, the node marked DOWN); SLURM requeues the
job (``slurm-requeue``), node2 comes back, and the segment runs again from its input
snapshot. Both snapshots must be bit-identical to the same config run locally as one node
of two processes, every step logged once. A second run allows one node
(``train.min_nnodes: 1``): its job outlives the loss (``--no-kill``) and runs the segment
again on node1 alone, node2 staying down; the result equals the reference up to the rounding
of one process summing what two did.

One cluster bring-up for the module (seconds), the smallest run that shows it (two segments
of 4 steps). Skipped, with the script's reason, where the cluster cannot be brought up (not
root, no network namespaces).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.slurm_cluster import CANNOT, RUN, job_env, run_config, was_up

from pipeline_lib.checkpoint.manifest import verify_snapshot
from pipeline_lib.checkpoint.restore import load_snapshot

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm_nodes.sh"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = ROOT / "config" / "experiments" / "tiny.yaml"
FAULT_SITE = Path(__file__).resolve().parents[1] / "support" / "fault_site"
STATE_DIR = Path("/tmp/loopline-slurm-nodes")
SLURM_CONF = STATE_DIR / "etc" / "slurm.conf"
SEGMENT, STEPS = 4, 8
PREFIX = f"llnodes{os.getpid()}"


def _config(nodes: int, procs: int, extra: str = "") -> str:
    return run_config(STEPS, SEGMENT, f"\n  nnodes: {nodes}\n  nproc: {procs}{extra}")


def _snapshot(workdir: Path, step: int) -> Path:
    return workdir / "results" / RUN / "snapshots" / f"step_{step:07d}"


def _script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=600)


def _slurm_env(workdir: Path) -> dict[str, str]:
    return {**job_env(workdir), "SLURM_CONF": str(SLURM_CONF)}


def _slurm(*cmd: str) -> str:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=True,
                          env={**os.environ, "SLURM_CONF": str(SLURM_CONF)}).stdout


def _command(workdir: Path, *, slurm: bool) -> list[str]:
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           str(_snapshot(workdir, STEPS).relative_to(workdir)),
           "--configfile", str(TINY), str(workdir / "nodes.yaml")]
    if slurm:
        return cmd + ["--profile", str(ROOT / "profiles" / "slurm"), "--slurm-jobname-prefix",
                      PREFIX, "--slurm-init-seconds-before-status-checks", "2"]
    return cmd + ["--cores", "2"]


def _workdir(tmp: Path, config: str) -> Path:
    tmp.mkdir(parents=True)
    (tmp / "nodes.yaml").write_text(config)
    return tmp


def _wait(what: str, ok, proc: subprocess.Popen, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert proc.poll() is None, f"snakemake ended while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _job_state(job: str) -> str:
    return _slurm("squeue", "-h", "-j", job, "-o", "%T").strip()


@pytest.fixture(scope="module")
def nodes():
    """The two-node cluster (down at the end when this module brought it up)."""
    started = not was_up(STATE_DIR)
    up = _script("up")
    if up.returncode == CANNOT:
        pytest.skip(f"no two-node SLURM cluster here: {up.stderr.strip().splitlines()[-1]}")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield
    finally:
        if started:
            _script("down")


@pytest.fixture(scope="module")
def lost_node_run(nodes, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two nodes per segment; node2 lost while the second segment pauses before step 6.
    Meanwhile (the cluster run mostly waits) the reference: the same config as one node of
    two processes (torchrun --standalone), run locally."""
    local = _workdir(tmp_path_factory.mktemp("nodes") / "local", _config(1, 2))
    reference = subprocess.Popen(_command(local, slurm=False), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=_slurm_env(local),
                                 cwd=local, start_new_session=True)
    try:
        seen = _lose_a_node(tmp_path_factory.mktemp("nodes") / "cluster")
        out, _ = reference.communicate(timeout=600)
    finally:
        if reference.poll() is None:
            os.killpg(reference.pid, 9)
            reference.wait()
    assert reference.returncode == 0, out[-5000:]
    return {**seen, "local": local}


@pytest.fixture(scope="module")
def local(lost_node_run: dict) -> Path:
    return lost_node_run["local"]


def _start_and_lose_node2(workdir: Path, config: str) -> tuple[subprocess.Popen, dict]:
    """Snakemake started on ``config``; node2 lost while the second segment pauses."""
    workdir = _workdir(workdir, config)
    paused = workdir / "paused"
    env = {**_slurm_env(workdir), "PYTHONPATH": os.pathsep.join(
        p for p in (str(FAULT_SITE), os.environ.get("PYTHONPATH", "")) if p),
        "LOOPLINE_FAULT_INJECT": f"pause_step={SEGMENT + 2},pause_s=10,pause_file={paused}"}
    log = open(workdir / "snakemake.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(_command(workdir, slurm=True), stdout=log, stderr=subprocess.STDOUT,
                            env=env, cwd=workdir, start_new_session=True)
    log.close()  # the child holds it
    seen: dict = {"workdir": workdir}
    try:
        _wait("the second segment's pause", paused.exists, proc)
        running = _slurm("squeue", "-h", "-t", "RUNNING", "-o", "%i|%k")
        seen["job"] = next(line.split("|")[0] for line in running.splitlines()
                           if f"_{RUN}_{STEPS:07d}" in line)
        lost = _script("lose", "2")
        assert lost.returncode == 0, lost.stderr
    except BaseException:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    return proc, seen


def _finish(proc: subprocess.Popen, seen: dict) -> dict:
    try:
        seen["rc"] = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    seen["log"] = (seen["workdir"] / "snakemake.log").read_text()
    return seen


def _lose_a_node(workdir: Path) -> dict:
    proc, seen = _start_and_lose_node2(workdir, _config(2, 1))
    try:
        # SLURM requeues the job of the failed node (same id; pending until it may start)
        _wait("the job requeued", lambda: _job_state(seen["job"]) in ("PENDING", ""), proc, 120)
        seen["state_after_loss"] = _job_state(seen["job"])
        back = _script("back", "2")
        assert back.returncode == 0, back.stderr
        if seen["state_after_loss"] == "PENDING":  # not after SLURM's 120-s requeue delay
            _slurm("scontrol", "update", f"JobId={seen['job']}", "StartTime=now")
    finally:
        seen = _finish(proc, seen)
    return seen


def _segment_logs(workdir: Path, step: int) -> str:
    folder = workdir / "logs" / "train_segment" / RUN
    return "".join(p.read_text() for p in sorted(folder.rglob(f"step_{step:07d}.attempt*.log")))


def _metrics_steps(workdir: Path) -> list[int]:
    metrics = workdir / "results" / RUN / "train" / "metrics.jsonl"
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


def test_the_run_with_a_lost_node_finishes(lost_node_run: dict) -> None:
    assert lost_node_run["rc"] == 0, lost_node_run["log"][-5000:]


def test_each_segment_is_one_torchrun_per_node_meeting_at_the_derived_rendezvous(
        lost_node_run: dict) -> None:
    log = _segment_logs(lost_node_run["workdir"], SEGMENT)
    launch = re.search(r"launching 2×1 processes: (srun .*)", log)
    assert launch, log[-4000:]
    cmd = launch.group(1).split()
    assert cmd[1:4] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    assert "--label" in cmd[:cmd.index("torch.distributed.run")]
    job = cmd[cmd.index("--rdzv-id") + 1]
    # node1's NodeAddr (not a name, not localhost), the port from the job id
    assert cmd[cmd.index("--rdzv-endpoint") + 1] == f"10.241.17.1:{20000 + int(job) % 20000}"
    assert "0: " in log and "1: " in log  # both nodes' output, labelled by srun


def test_two_nodes_give_the_bits_of_one_node_of_two_processes(lost_node_run: dict,
                                                              local: Path) -> None:
    for step in (SEGMENT, STEPS):  # before the loss, and the segment that lost a node
        ours, theirs = _snapshot(lost_node_run["workdir"], step), _snapshot(local, step)
        verify_snapshot(ours)  # every file of the sharded snapshot there and intact
        a, b = load_snapshot(ours), load_snapshot(theirs)
        assert a.trainer_state["world_size"] == b.trainer_state["world_size"] == 2
        assert a.model_state.keys() == b.model_state.keys()
        assert all(a.model_state[k].equal(b.model_state[k]) for k in a.model_state), step


def test_every_step_once_despite_the_lost_node(lost_node_run: dict, local: Path) -> None:
    wd = lost_node_run["workdir"]
    assert _metrics_steps(wd) == list(range(1, STEPS + 1))
    ours = [json.loads(x) for x in (wd / "results" / RUN / "train" / "metrics.jsonl")
            .read_text().splitlines()]
    theirs = [json.loads(x) for x in (local / "results" / RUN / "train" / "metrics.jsonl")
              .read_text().splitlines()]
    assert [m["loss"] for m in ours] == [m["loss"] for m in theirs]
    # the lost attempt's log shows the job that lost node2; the segment ran once more
    log = _segment_logs(wd, STEPS)
    assert log.count(f"segment {SEGMENT}→{STEPS} done") == 1, log[-4000:]


def test_the_lost_node_fails_the_job_in_one_line_and_slurm_requeues_it(
        lost_node_run: dict) -> None:
    states = _slurm("sacct", "-X", "-D", "-n", "-P", "-j", lost_node_run["job"], "-o", "State")
    assert states.split() == ["NODE_FAIL", "COMPLETED"]  # one job id, requeued once
    first = next((lost_node_run["workdir"] / "logs" / "train_segment" / RUN)
                 .rglob(f"step_{STEPS:07d}.attempt1.log")).read_text()
    # one line says why (here: srun's "Node failure on node2", unless node1's task ended first)
    assert re.search(r"ERROR .*: 2-process training to step 8 failed: \S", first), first[-3000:]


@pytest.fixture(scope="module")
def fewer_nodes_run(lost_node_run: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same run allowed to go on with one node (``train.min_nnodes: 1``): node2 is lost
    in the second segment and stays down until the run has finished."""
    workdir = tmp_path_factory.mktemp("nodes") / "fewer"
    proc, seen = _start_and_lose_node2(workdir, _config(2, 1, "\n  min_nnodes: 1"))
    try:
        seen = _finish(proc, seen)
    finally:
        back = _script("back", "2")
    assert back.returncode == 0, back.stderr
    return seen


def test_a_job_allowed_fewer_nodes_goes_on_with_the_node_left(fewer_nodes_run: dict) -> None:
    assert fewer_nodes_run["rc"] == 0, fewer_nodes_run["log"][-5000:]
    states = _slurm("sacct", "-X", "-D", "-n", "-P", "-j", fewer_nodes_run["job"], "-o", "State")
    # one job, resized (node2 taken out of it), not ended and requeued
    assert states.split() == ["RESIZING", "COMPLETED"]
    log = _segment_logs(fewer_nodes_run["workdir"], STEPS)
    assert re.search(r"WARNING .*: node2 failed and left the job; going on with the 1 node\(s\) "
                     r"left \(node1; train.min_nnodes = 1\): the segment again from its input, "
                     r"1 process\(es\)", log), log[-4000:]
    launches = re.findall(r"launching (\d)×1 processes: srun --nodes=(\d)", log)
    assert launches == [("2", "2"), ("1", "1")], launches
    assert log.count(f"segment {SEGMENT}→{STEPS} done") == 1


def test_on_fewer_nodes_the_weights_differ_only_by_rounding(fewer_nodes_run: dict,
                                                            local: Path) -> None:
    """Same rows per step (global data order), one process summing what two did: the
    segment before the loss is bit-identical, the one finished on node1 equal up to
    rounding; every step logged once."""
    wd = fewer_nodes_run["workdir"]
    before, reference = load_snapshot(_snapshot(wd, SEGMENT)), load_snapshot(_snapshot(local, SEGMENT))
    assert all(before.model_state[k].equal(reference.model_state[k]) for k in reference.model_state)
    verify_snapshot(_snapshot(wd, STEPS))
    after, reference = load_snapshot(_snapshot(wd, STEPS)), load_snapshot(_snapshot(local, STEPS))
    assert after.trainer_state["world_size"] == 1 and reference.trainer_state["world_size"] == 2
    worst = max((after.model_state[k] - reference.model_state[k]).abs().max().item()
                for k in reference.model_state)
    assert worst < 1e-5, worst
    assert _metrics_steps(wd) == list(range(1, STEPS + 1))
    ours = [json.loads(x)["loss"] for x in (wd / "results" / RUN / "train" / "metrics.jsonl")
            .read_text().splitlines()]
    theirs = [json.loads(x)["loss"] for x in (local / "results" / RUN / "train" /
                                              "metrics.jsonl").read_text().splitlines()]
    assert ours[:SEGMENT] == theirs[:SEGMENT]
    assert ours == pytest.approx(theirs, rel=1e-5)
