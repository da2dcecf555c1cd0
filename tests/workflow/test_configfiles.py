"""Snakemake's --configfile list, merged by loopline's rules (the example of README.md and docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.workflow_runs import job_counts, snakemake

pytestmark = pytest.mark.slow


def test_readme_example_plans_only_the_variants_of_the_file_that_lists_runs(tmp_path: Path):
    """``snakemake --configfile config/experiments/tiny.yaml my.yaml`` where my.yaml lists
    runs: Snakemake's own merge would add its variants to tiny.yaml's loops1 and loops2."""
    mine = tmp_path / "my.yaml"
    mine.write_text("train: {total_steps: 40}\nruns:\n  mine: {model: {loops: 3}}\n")
    result = snakemake(tmp_path, "--cores", "1", "-n", extra_configs=(mine,))
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = job_counts(result.stdout)
    # one variant; tiny.yaml's segments of 10 and keep_last 2 over my.yaml's 40 steps
    assert (jobs["track_init"], jobs["train_segment"], jobs["train_segment_temp"]) == (1, 2, 2)
    assert "results/mine/" in result.stdout
    assert "results/loops1/" not in result.stdout and "results/loops2/" not in result.stdout

    # --config still applies last, over both files
    result = snakemake(tmp_path, "--cores", "1", "-n", "--config", "train={total_steps: 20}",
                       extra_configs=(mine,))
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = job_counts(result.stdout)
    assert (jobs["track_init"], jobs["train_segment"]) == (1, 2)
    assert "train_segment_temp" not in jobs
