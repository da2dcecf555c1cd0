"""SIGTERM to a segment job under Snakemake (with ``retries``) at a random step: the retry
continues from the resume point; weights bit-identical, every MLflow step exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.workflow_runs import segment_pids

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
TINY = ROOT / "config" / "experiments" / "tiny.yaml"
RUN = "loops2"
SLOWER = """
train:
  micro_batch_rows: 2  # four passes per step: a segment lasts long enough to be signalled
runs:
  loops2:
    model: {loops: 2}
"""


def _env(workdir: Path) -> dict[str, str]:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(workdir / ".hf"), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _steps_logged(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


@pytest.mark.slow
def test_sigterm_under_snakemake_retries_from_the_resume_point(tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    workdir.mkdir()
    (workdir / "slower.yaml").write_text(SLOWER)
    final = workdir / "results" / RUN / "snapshots" / "step_0000030"
    cmd = [str(SNAKEMAKE), "--snakefile", str(ROOT / "Snakefile"), "--directory", str(workdir),
           "--configfile", str(TINY), str(workdir / "slower.yaml"), "--cores", "1",
           str(final.relative_to(workdir))]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(workdir), cwd=workdir)
    metrics = workdir / "results" / RUN / "train" / "metrics.jsonl"
    target = 20 + random.Random().randint(1, 6)  # a random step of the last segment
    deadline = time.monotonic() + 600
    while _steps_logged(metrics) < target:
        assert proc.poll() is None, f"snakemake ended early: {proc.stdout.read()[-4000:]}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    pids = segment_pids(workdir)
    assert pids, "no train_segment process found"
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-6000:]

    state = json.loads((final / "trainer_state.json").read_text())
    assert [p["reason"] for p in state["preemptions"]] == ["SIGTERM"], state["preemptions"]
    stopped = state["preemptions"][0]["step"]
    assert 20 < stopped < 30
    # no resume point left: the last segment's slot holds its snapshot's files (hard links)
    slots = list((workdir / "results" / RUN / "train" / "resume").glob("step_*"))
    assert [p.name for p in slots] == [final.name]
    assert (slots[0] / "model.safetensors").stat().st_ino == \
        (final / "model.safetensors").stat().st_ino
    steps = [json.loads(x)["step"] for x in metrics.read_text().splitlines()]
    assert steps == list(range(1, 31))

    # the same segment uninterrupted, from the same kept input snapshot
    start = workdir / "results" / RUN / "snapshots" / "step_0000020"
    data = next(p for p in (workdir / "results" / "data").iterdir() if p.is_dir())
    ref = tmp_path / "ref" / "snapshots" / "step_0000030"
    done = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "train", "--config", str(start / "config.yaml"),
         "--data", str(data), "--resume-from", str(start), "--until-step", "30",
         "--out", str(ref), "--no-track"], capture_output=True, text=True, env=_env(workdir))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (final / "model.safetensors").read_bytes() == (ref / "model.safetensors").read_bytes()

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    history = client.get_metric_history(state["tracking_run_id"], "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 31))  # each step exactly once
