"""Each job runs the spec its call planned, proven by digest (issue 39, class 1), through real
Snakemake calls of the smallest one-variant pipeline (its first segment trained once):

- ``--no-hooks`` after a config change (no spec written for it) stops the job in one line
  instead of training the previous call's spec under the new signature;
- a spec edited between planning and the job stops it in one line; the next call (with its
  hooks) writes the file again and the job trains;
- a cluster job's own Snakemake (``--mode remote``) plans with the spec the main call named in
  its environment, even when the config file changed since; without it the job plans again,
  and a spec no call wrote stops it in one line.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.rel_state_helpers import (
    CONFIG,
    RUN,
    clone,
    failure_report,
    snakemake,
    workdir_after,
)
from support.workflow_runs import ROOT, SNAKEMAKE

pytestmark = pytest.mark.slow
FIRST = f"results/{RUN}/snapshots/transient/step_0000002"  # segment 0→2 (temporary)
SECOND = f"results/{RUN}/snapshots/step_0000004"  # segment 2→4 (kept), resumes from FIRST
SPEC_ENV = "LOOPLINE_RUN_SPECS"
LR = 0.002  # the default train.lr, which CONFIG keeps


@pytest.fixture(scope="module")
def first_segment(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where the pack is made and the first segment trained (no
    tracking store: nothing here is about MLflow)."""
    return workdir_after(tmp_path_factory.mktemp("run_specs") / "base",
                         CONFIG + "tracking: {enabled: false}\n", FIRST)


def _spec_file(work: Path) -> Path:
    (spec,) = (work / "results" / RUN / "specs").glob("*.yaml")  # one call, one spec
    return spec


def _error_line(result: subprocess.CompletedProcess, *parts: str) -> str:
    out = result.stdout + result.stderr
    lines = [line for line in out.splitlines() if line.startswith("error: ")]
    assert lines, out[-4000:]
    assert all(part in lines[0] for part in parts), (lines[0], parts)
    return lines[0]


def _steps_trained(work: Path) -> list[int]:
    metrics = work / "results" / RUN / "train" / "metrics.jsonl"
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()]


def _trained_lr(snapshot: Path) -> float:
    return yaml.safe_load((snapshot / "config.yaml").read_text())["train"]["lr"]


def _lr_file(tmp_path: Path, lr: float) -> Path:
    path = tmp_path / "lr.yaml"
    path.write_text(f"train: {{lr: {lr}}}\n")
    return path


def test_no_hooks_after_a_config_change_stops_in_one_line(first_segment: Path,
                                                          tmp_path: Path) -> None:
    work = clone(first_segment, tmp_path / "work")
    result = snakemake(work, "--cores", "1", "--no-hooks", SECOND,
                       configs=(_lr_file(tmp_path, 0.004),))
    assert result.returncode != 0, result.stdout[-3000:]
    line = _error_line(result, "does not exist", "(not with --no-hooks)")
    assert re.search(rf"results/{RUN}/specs/[0-9a-f]{{16}}\.yaml", line), line
    assert not (work / SECOND).exists()
    assert _steps_trained(work) == [1, 2]  # nothing trained under the stale spec
    assert [p.name for p in (work / "results" / RUN / "specs").iterdir()] == \
        [_spec_file(first_segment).name]


def test_a_spec_edited_after_planning_stops_the_job_until_written_again(
        first_segment: Path, tmp_path: Path) -> None:
    work = clone(first_segment, tmp_path / "work")
    spec = _spec_file(work)
    text = spec.read_text()
    assert f"lr: {LR}\n" in text
    spec.write_text(text.replace(f"lr: {LR}\n", "lr: 0.02\n"))  # a valid, other config
    result = snakemake(work, "--cores", "1", "--no-hooks", SECOND)
    assert result.returncode != 0, result.stdout[-3000:]
    _error_line(result, f"results/{RUN}/specs/{spec.name} was changed after it was written")
    assert not (work / SECOND).exists()

    again = snakemake(work, "--cores", "1", SECOND)  # onstart writes the file again
    assert again.returncode == 0, failure_report(work, again)
    assert spec.read_text() == text
    assert _trained_lr(work / SECOND) == LR and _steps_trained(work) == [1, 2, 3, 4]


def _remote_job(work: Path, environ: dict[str, str]) -> subprocess.CompletedProcess:
    """What a cluster executor runs on the node for the second segment's job."""
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(work),
           "--configfile", str(work / "config.yaml"), "--cores", "1", "--mode", "remote",
           "--target-jobs", f"train_segment:run={RUN},step=0000004", "--force", "--nolock",
           "--no-hooks", "--ignore-incomplete", "--retries", "0", "all"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **environ}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work, timeout=900)


def test_a_cluster_job_plans_with_the_spec_its_call_named(first_segment: Path,
                                                          tmp_path: Path) -> None:
    work = clone(first_segment, tmp_path / "work")
    digest = _spec_file(work).stem
    config = work / "config.yaml"
    assert "\ntrain:\n" in config.read_text()
    config.write_text(config.read_text().replace("\ntrain:\n", "\ntrain:\n  lr: 0.004\n"))
    # the config file changed after the main call planned: the job still runs its spec
    result = _remote_job(work, {SPEC_ENV: f"{RUN}={digest}"})
    assert result.returncode == 0, result.stderr[-4000:]
    assert _trained_lr(work / SECOND) == LR

    shutil.rmtree(work / SECOND)
    # planned again (no digests handed down): the edited config is a spec no call wrote
    result = _remote_job(work, {SPEC_ENV: ""})
    assert result.returncode != 0
    _error_line(result, "does not exist", "run snakemake again")
    assert not (work / SECOND).exists()
