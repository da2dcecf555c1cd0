"""The latent-trajectory rule is opt-in: a plain ``snakemake`` never plans it, the target
rule ``trajectories`` plans one job per run (on its final snapshot)."""

from __future__ import annotations

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
    assert "results/loops1/eval/trajectories/step_" in asked.stdout
