"""Runs of thousands of segments: planned without recursion limits (anchors), and what the
anchors leave unchanged in a real run (rotation, nothing to do on a re-run, rebuilds)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.workflow_runs import ROOT, job_counts, snakemake

pytestmark = pytest.mark.slow
RUN = "solo"


def _config(path: Path, total_steps: int, **snapshots: int) -> Path:
    path.write_text(f"train: {{total_steps: {total_steps}, steps_per_segment: 10}}\n"
                    f"snapshots: {{keep_last: {snapshots.get('keep_last', 1)}, "
                    f"keep_every: {snapshots.get('keep_every', 0)}}}\n"
                    "tracking: {enabled: false}\n"
                    f"runs: {{{RUN}: {{}}}}\n")
    return path


def test_5000_temporary_segments_plan(tmp_path: Path):
    """Without anchors, Snakemake ends this in a RecursionError ("likely due to a cyclic
    dependency") from about 480 temporary segments in a row on."""
    config = _config(tmp_path / "long.yaml", 50_000)
    result = snakemake(tmp_path, "--cores", "1", "-n", "--quiet", "rules",
                       extra_configs=(config,))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    jobs = job_counts(result.stdout)
    assert (jobs["train_segment"], jobs["train_segment_temp"], jobs["segment_anchor"]) == \
        (1, 4999, 49)


def test_anchored_chain_rotates_reruns_nothing_and_rebuilds(tmp_path: Path, monkeypatch):
    """A real run with anchors every 2 segments (set for the test through a sitecustomize
    module that every Snakemake and job process imports): the temporary snapshots still go,
    a re-run has nothing to do, a deleted anchor is rewritten without retraining, and a
    deleted kept snapshot is rebuilt."""
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(
        "import pipeline_lib.spec.snapshots as policy\n"
        "policy.ANCHOR_SEGMENTS = 2\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim), str(ROOT / "src")]))
    work = tmp_path / "work"
    work.mkdir()
    config = _config(tmp_path / "anchored.yaml", 50)  # kept: 50; anchors: 20, 40
    runs = Path("results") / RUN  # targets relative to the working directory, as in rules
    targets = [str(runs / "train" / "anchors" / f"step_{s:07d}.tsv") for s in (20, 40)]
    targets.append(str(runs / "snapshots" / "step_0000050"))
    final = work / targets[-1]
    result = snakemake(work, "--cores", "2", *targets, extra_configs=(config,))
    assert result.returncode == 0, result.stderr[-4000:]
    assert job_counts(result.stderr + result.stdout)["segment_anchor"] == 2
    assert final.is_dir() and all((work / t).stat().st_size > 0 for t in targets[:2])
    assert not list((work / runs / "snapshots" / "transient").glob("step_*")), "temp kept"

    again = snakemake(work, "--cores", "1", "-n", *targets, extra_configs=(config,))
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, \
        again.stdout[-2000:]

    (work / targets[0]).unlink()  # its segment's benchmark record is still there: no retraining
    result = snakemake(work, "--cores", "1", "-n", *targets, extra_configs=(config,))
    assert job_counts(result.stdout) == {"segment_anchor": 1}, result.stdout[-2000:]

    shutil.rmtree(final)  # a kept snapshot: rebuilt, with the temporary chain before it
    result = snakemake(work, "--cores", "1", "-n", *targets, extra_configs=(config,))
    jobs = job_counts(result.stdout)
    assert (jobs.get("train_segment"), jobs.get("train_segment_temp")) == (1, 4), jobs
