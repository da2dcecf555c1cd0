"""Helpers of the workflow-state reliability tests (tests/reliability/test_rel_state.py):
the smallest one-variant pipeline, a Snakemake runner, an MLflow reader."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from . import workflow_runs

RUN = "solo"
SEGMENT_ENDS = [2, 4, 6]
KEPT = [4, 6]  # keep_last 2 (+ final); step 2 is a temporary snapshot
EXPERIMENT = "loopline-rel-state"

# One variant, three segments of two steps, one cheap benchmark: every rule runs once or
# per kept snapshot. A complete file (not merged over tiny.yaml, whose variants would add).
CONFIG = f"""
experiment: {{name: {EXPERIMENT}}}
data:
  sources: [{{type: reasoning, num_docs: 300, max_difficulty: 3}}]
  seq_len: 64
  epochs: 1
  val_fraction: 0.05
model: {{d_model: 32, n_heads: 2, loops: 2}}
train:
  total_steps: 6
  steps_per_segment: 2
  global_batch_rows: 8
  micro_batch_rows: 8
  warmup_steps: 2
  eval_interval: 2
  eval_rows: 8
  diagnostics_interval: 2
  sample_tokens: 4
  spike: {{warmup_steps: 2}}
snapshots: {{keep_last: 2}}
eval: {{h_eff: [1, 2], max_tokens: 1024}}
bench: {{tasks: [loopline_parity], h_eff: [1], examples_per_level: 2, max_difficulty: 3,
        max_gen_toks: 4}}
runs:
  {RUN}: {{}}
"""


def snakemake(workdir: Path, *args: str, configs: tuple[Path, ...] = (),
              timeout: int = 900) -> subprocess.CompletedProcess:
    """``snakemake --directory workdir --configfile workdir/config.yaml [configs] …``."""
    return workflow_runs.snakemake(workdir, *args, extra_configs=configs, timeout=timeout,
                                   config=workdir / "config.yaml")


def failure_report(workdir: Path, result: subprocess.CompletedProcess) -> str:
    logs = "\n".join(f"== {p}\n{p.read_text()[-2000:]}"
                     for p in sorted((workdir / "logs").rglob("*.log")))
    return f"{result.stderr[-5000:]}\n{logs[-10000:]}"


def workdir_after(base: Path, config: str, *targets: str) -> Path:
    """``base`` (a new directory) holding ``config.yaml`` and what ``snakemake targets``
    made there (the whole pipeline without targets); the test fails with the report."""
    base.mkdir()
    (base / "config.yaml").write_text(config)
    result = snakemake(base, "--cores", "2", *targets)
    if result.returncode != 0:
        pytest.fail(f"snakemake {' '.join(targets) or 'all'} failed:\n"
                    f"{failure_report(base, result)}")
    return base


def clone(workdir: Path, dest: Path) -> Path:
    """A copy of a working directory (mtimes and the `final` link kept)."""
    shutil.copytree(workdir, dest, symlinks=True)
    return dest


def store(workdir: Path) -> Any:
    from mlflow import MlflowClient

    return MlflowClient(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")


def runs_by_stage(workdir: Path) -> tuple[Any, dict[str, list[Any]]]:
    """(the parent run, its children by ``loopline.stage``, oldest first)."""
    client = store(workdir)
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], max_results=1000,
                              order_by=["attributes.start_time ASC"])
    parent = next(r for r in runs if r.data.tags.get("loopline.role") == "parent")
    children: dict[str, list[Any]] = {}
    for r in runs:
        if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id:
            children.setdefault(r.data.tags["loopline.stage"], []).append(r)
    return parent, children
