"""The latent-trajectory rule is opt-in: a plain ``snakemake`` never plans it, the target
rule ``trajectories`` plans one job per run (on its final snapshot)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.workflow_runs import job_counts, snakemake

pytestmark = pytest.mark.slow


def test_trajectories_run_only_when_asked(tmp_path: Path):
    plain = snakemake(tmp_path, "--cores", "1", "-n")
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "eval_trajectories" not in job_counts(plain.stdout)
    asked = snakemake(tmp_path, "--cores", "1", "-n", "trajectories")
    assert asked.returncode == 0, asked.stderr[-3000:]
    jobs = job_counts(asked.stdout)
    assert jobs["eval_trajectories"] == 2  # tiny.yaml's two variants
    assert "eval_heff" not in jobs and "bench_downstream" not in jobs
    for run in ("loops1", "loops2"):  # the final snapshot (tiny.yaml: 30 steps)
        assert f"results/{run}/eval/trajectories/step_0000030" in asked.stdout


def test_the_target_rule_writes_each_runs_trajectories(tiny_pipeline: Path, tmp_path: Path):
    """On a copy of the finished tiny pipeline (the shared one keeps only ``all``'s
    outputs): ``snakemake trajectories`` runs one job per run and nothing else."""
    work = tmp_path / "work"
    shutil.copytree(tiny_pipeline, work, symlinks=True)
    result = snakemake(work, "--cores", "1", "trajectories")
    assert result.returncode == 0, result.stderr[-3000:]
    assert job_counts(result.stdout + result.stderr) == {"eval_trajectories": 2,
                                                        "trajectories": 1}
    for run, loops in (("loops1", 1), ("loops2", 2)):
        out = work / "results" / run / "eval" / "trajectories" / "step_0000030"
        doc = json.loads((out / "trajectories.json").read_text())
        assert (doc["step"], doc["training_loops"], doc["max_loops"]) == (30, loops, 2 * loops)
        assert doc["tokens"] == sum(doc["classes"].values()) > 0
        assert (out / "trajectories.png").stat().st_size > 0
