"""A real two-node launch on this machine: ``run_training_job`` with ``train.nnodes = 2`` inside
a (pretended) SLURM allocation calls ``srun``, which here is a stand-in on ``PATH`` that starts
one torchrun per "node" (tests/support/stand_in_srun.py); the two torchruns meet through a
c10d rendezvous on loopback, each with one gloo worker. The result must be the run of one
node with the same world size (2 processes): the same rows, losses and bit-identical weights.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from support.stand_in_srun import install_stand_in_srun
from trainer_helpers import make_pack, metrics, snap, tiny_config

from pipeline_lib.checkpoint.restore import load_snapshot
from pipeline_lib.errors import TrainingError
from pipeline_lib.spec.data_id import data_id
from pipeline_lib.train.launch import run_training_job

pytestmark = pytest.mark.slow

CFG = tiny_config("model.moe_experts=4", "model.moe_top_k=2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_train_exactly_like_one_node_of_two_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pack = make_pack(tmp_path / "data" / data_id(CFG.data))
    one_node = replace(CFG, train=replace(CFG.train, nproc=2))
    endpoint = f"127.0.0.1:{free_port()}"
    two_nodes = replace(CFG, train=replace(CFG.train, nproc=1, nnodes=2, rdzv_endpoint=endpoint))
    one, two = tmp_path / "one", tmp_path / "two"
    run_training_job(one_node, pack, None, 3, snap(one, 3), one)

    bin_dir = tmp_path / "bin"
    install_stand_in_srun(bin_dir)
    srun_log = tmp_path / "srun.json"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "")  # no scontrol asked: the endpoint is given
    monkeypatch.setenv("STAND_IN_SRUN_LOG", str(srun_log))
    run_training_job(two_nodes, pack, None, 3, snap(two, 3), two)

    # srun started one torchrun per node, joined by c10d at the endpoint
    call = json.loads(srun_log.read_text())
    assert call["options"] == {"nodes": "2", "ntasks-per-node": "1", "cpus-per-task": "1",
                               "ntasks": "2", "kill-on-bad-exit": "1", "label": ""}
    cmd = call["command"]
    for flag, value in (("--nnodes", "2"), ("--rdzv-backend", "c10d"),
                        ("--rdzv-endpoint", endpoint), ("--rdzv-id", "4242"),
                        ("--rdzv-conf", "join_timeout=600"),
                        ("--nproc_per_node", "1")):
        assert cmd[cmd.index(flag) + 1] == value
    # the workers read the config from the run directory (shared storage), removed after
    config = Path(cmd[cmd.index("--config") + 1])
    assert config == two / "train" / "launch" / "step_0000003.yaml" and not config.exists()

    a, b = metrics(one), metrics(two)
    assert [m["step"] for m in b] == [1, 2, 3]
    for m1, m2 in zip(a, b, strict=True):
        for key in ("loss", "aux_loss", "grad_norm", "cursor", "tokens_seen", "loops"):
            assert m1[key] == m2[key], (m1["step"], key)
    assert a[-1]["val_loss"] == b[-1]["val_loss"]
    sa, sb = load_snapshot(snap(one, 3)), load_snapshot(snap(two, 3))
    assert sa.model_state.keys() == sb.model_state.keys()
    assert all(torch.equal(sa.model_state[k], sb.model_state[k]) for k in sa.model_state)
    assert sa.trainer_state["world_size"] == sb.trainer_state["world_size"] == 2


def test_a_node_that_never_starts_torchrun_ends_the_job_in_one_line(tmp_path: Path) -> None:
    """Two nodes expected, one torchrun started (as a node whose launcher never runs): the
    rendezvous gives up after train.rdzv_timeout_s and the job says so in one line."""
    pack = make_pack(tmp_path / "data" / data_id(CFG.data))
    endpoint = f"127.0.0.1:{free_port()}"
    alone = replace(CFG, train=replace(CFG.train, nproc=1, nnodes=2, rdzv_endpoint=endpoint,
                                       rdzv_timeout_s=3))
    with pytest.raises(TrainingError) as failed:
        run_training_job(alone, pack, None, 3, snap(tmp_path / "run", 3), tmp_path / "run")
    assert str(failed.value) == (
        f"2-process training to step 3 failed: the rendezvous at {endpoint} did not complete "
        f"within 3 s: fewer than 2 nodes joined (a node whose torchrun did not start, or that "
        f"cannot reach {endpoint}; train.rdzv_timeout_s sets the wait); the full output is in "
        "the job log")
    assert not snap(tmp_path / "run", 3).exists()
