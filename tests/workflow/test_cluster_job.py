"""Snakemake inside a cluster job (pipeline_lib.workflow.cluster_job), the segment's attempt
number, the SIGUSR1 lead and every submitted rule's resources: what test_slurm.py sees on a
real cluster, here without one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.workflow_runs import ROOT, snakemake

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.workflow.attempt_log import current_attempt, open_attempt_log
from pipeline_lib.workflow.cluster_job import stopped_since, target_segment
from pipeline_lib.workflow.cluster_resources import segment_time


def local_rules() -> set[str]:
    """The rules the .smk files declare under ``localrules:`` (run by Snakemake itself)."""
    names, inside = {"all"}, False
    for smk in (ROOT / "workflow" / "rules").glob("*.smk"):
        for line in smk.read_text().splitlines():
            if line.startswith("localrules:"):
                inside = True
            elif inside and line.startswith("    ") and line.strip().endswith(","):
                names.add(line.strip().rstrip(","))
            else:
                inside = False
    return names



def test_the_segment_a_job_runs_is_read_from_its_command_line() -> None:
    argv = ["snakemake", "--target-jobs", "train_segment_temp:run=loop4,step=0000200",
            "--mode", "remote"]
    assert target_segment(argv) == ("loop4", 200)
    assert target_segment(["snakemake", "--target-jobs", "eval_heff:run=a,step=0000010"]) is None
    assert target_segment(["snakemake", "--cores", "2"]) is None


def test_stopped_means_no_snapshot_and_a_resume_point_of_this_attempt(tmp_path: Path) -> None:
    run = tmp_path / "loop4"
    out = run / "snapshots" / "step_0000020"
    started = time.time() - 5
    assert not stopped_since(run, 20, out, started)  # nothing written
    point = RunLayout.at(run).resume_point(20)
    point.mkdir(parents=True)
    (point / "trainer_state.json").write_text("{}")
    assert stopped_since(run, 20, out, started)
    assert not stopped_since(run, 20, out, time.time() + 60)  # an older attempt's
    (point / "trainer_state.json").write_text('{"step": 20}')  # the finished segment's files
    assert not stopped_since(run, 20, out, started)
    out.mkdir(parents=True)
    assert not stopped_since(run, 20, out, started)  # the segment finished after all


def test_the_attempt_number_goes_on_across_jobs(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "step_0000020.log"
    for expected in (1, 2, 3):  # each a new process (a resubmission, a requeue) in real life
        with open_attempt_log(log):
            assert current_attempt(log) == expected


def test_sigusr1_lead_is_the_stop_margin() -> None:
    cfg = config_from_dict({"train": {"segment_runtime_minutes": 240,
                                      "stop_margin_minutes": 10}})
    assert segment_time(cfg) == {"runtime": 240, "slurm_extra": "--signal=USR1@600"}
    off = config_from_dict({"train": {"stop_margin_minutes": 0}})
    assert "slurm_extra" not in segment_time(off)
    with pytest.raises(ConfigError, match=r"train.stop_margin_minutes = 0.001 is under a second"):
        config_from_dict({"train": {"stop_margin_minutes": 0.001}})


@pytest.mark.slow
def test_every_submitted_rule_gets_partition_account_and_resources(tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text(
        "resources: {slurm_partition: gpu, slurm_account: proj, eval_mem_mb: 3000, "
        "train_mem_mb: 3500, eval_runtime_minutes: 20}\n"
        "train: {segment_runtime_minutes: 90, stop_margin_minutes: 2}\n")
    done = snakemake(tmp_path, "-n", "--cores", "1", extra_configs=(tmp_path / "cluster.yaml",))
    assert done.returncode == 0, done.stderr[-3000:]
    jobs, rule = {}, None
    for line in done.stdout.splitlines():
        if line.startswith(("rule ", "localrule ")):
            rule = line.rstrip(":")
        elif line.strip().startswith("resources:") and rule:
            jobs.setdefault(rule, line)
    local = local_rules()
    assert {"tracking_store", "track_init", "segment_anchor"} <= local
    submitted = {r: res for r, res in jobs.items() if r.split()[1] not in local}
    assert {r.split()[1] for r in submitted} >= {
        "pack_data", "train_segment", "snapshot_index", "eval_heff", "summarize_heff",
        "bench_downstream", "summarize_bench", "export", "compare_runs"}
    for r, res in submitted.items():
        assert "slurm_partition=gpu" in res and "slurm_account=proj" in res, (r, res)
        train = r.split()[1].startswith("train_segment")
        assert ("mem_mb=3500" if train else "mem_mb=3000") in res, (r, res)
        assert ("runtime=90" if train else "runtime=20") in res, (r, res)
        assert ("slurm_extra=--signal=USR1@120" in res) == train, (r, res)
