"""The torchrun command of a segment and the failing rank's line."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest
from trainer_helpers import tiny_config

from pipeline_lib.errors import ConfigError
from pipeline_lib.train.launch import (
    failure_line,
    job_rendezvous,
    rendezvous_args,
    torchrun_command,
)
from pipeline_lib.train.rendezvous import Rendezvous


def with_train(**changes):
    cfg = tiny_config()
    return replace(cfg, train=replace(cfg.train, **changes))


def test_single_node_command_is_standalone_with_the_train_arguments() -> None:
    cmd = torchrun_command(with_train(nproc=4), ["--out", "o", "--attempt", "2"], env={})
    assert cmd == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes",
                   "1", "--nproc_per_node", "4", "-m", "pipeline_lib", "train", "--out", "o",
                   "--attempt", "2"]


def test_multi_node_rendezvous_from_config_then_environment() -> None:
    cfg = with_train(nproc=2, nnodes=3, rdzv_endpoint="node7:29400", rdzv_timeout_s=45)
    rdzv = job_rendezvous(cfg, env={})
    assert rdzv == Rendezvous("node7:29400", 3, (), 45)
    assert rendezvous_args(rdzv, env={"SLURM_JOB_ID": "881"}) == [
        "--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node7:29400",
        "--rdzv-id", "881", "--rdzv-conf", "join_timeout=45"]
    env_cfg = with_train(nproc=2, nnodes=2)
    master = {"MASTER_ADDR": "n1", "MASTER_PORT": "1234"}
    assert rendezvous_args(job_rendezvous(env_cfg, master), master,
                           job_id="step_0000010")[5:8] == ["n1:1234", "--rdzv-id", "step_0000010"]
    with pytest.raises(ConfigError, match="train.rdzv_endpoint"):
        job_rendezvous(env_cfg, env={})
    assert job_rendezvous(with_train(nproc=2), env={}) is None  # one node: --standalone


def test_inside_slurm_srun_starts_one_labelled_torchrun_per_node_with_the_node_cpus(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from support.stand_in_srun import install_stand_in_srun

    install_stand_in_srun(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    cfg = with_train(nproc=4, nnodes=2, rdzv_endpoint="n1:29400")
    cfg = replace(cfg, resources=replace(cfg.resources, train_cpus=30, train_gpus=4))
    rdzv = Rendezvous("n1:29400", 2, ("n1", "n2"), 600)
    cmd = torchrun_command(cfg, ["--out", "o"], rdzv=rdzv, env={"SLURM_JOB_ID": "7"})
    # 30 CPUs over 4 processes: the job holds 7 per process (cluster_resources), 28 per node
    assert cmd[:9] == ["srun", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=28",
                       "--ntasks=2", "--gres=gpu:4", "--kill-on-bad-exit=1", "--label",
                       sys.executable]
    assert torchrun_command(cfg, [], rdzv=rdzv, env={})[0] == sys.executable  # no allocation


def test_failure_line_prefers_the_one_line_pipeline_error() -> None:
    lines = [
        "[rank1]: Traceback (most recent call last):\n",
        "[rank1]: RuntimeError: connection reset by peer\n",
        "error: rank 0: --until-step 99 exceeds the run's 6 steps; lower it\n",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
    ]
    assert failure_line(lines) == "rank 0: --until-step 99 exceeds the run's 6 steps; lower it"
    assert failure_line(lines[:2]) == "rank 1: RuntimeError: connection reset by peer"
    assert failure_line(["all fine\n"]) is None


def test_workers_of_an_untracked_launch_are_told_not_to_track(tmp_path) -> None:
    """The workers run the ``train`` command, which tracks (it is the train stage's door):
    a launch given no tracking passes them ``--no-track``."""
    from pipeline_lib.train.launch import _train_args

    args = (tmp_path / "c.yaml", tmp_path / "data", None, 4, tmp_path / "out", None, 1, None)
    assert "--no-track" in _train_args(*args, tracked=False)
    assert "--no-track" not in _train_args(*args, tracked=True)
