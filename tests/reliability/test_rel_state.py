"""The workflow notices missing and stale state.

- A deleted kept snapshot and the final one are rebuilt by the next ``snakemake`` (with the
  temporary snapshot before them, and what resumes from or evaluates them; not the pack,
  nor the tracking set-up), bit-identical; ``index.json`` and ``snapshots/final`` point at
  what is there; a copied run directory keeps its parent's ``loopline.data_id``.
- A config change updates the parent MLflow run (config hash, changed params with their
  current values, the config artifact) and tags the stage runs it replaced
  ``loopline.superseded = true``.
- Every attempt of a job keeps its own log (a Snakemake retry used to overwrite it).
- Changing only the retention (``snapshots.keep_last``) retrains nothing: a grown one cannot
  bring back a deleted temporary snapshot (one line says so), a shrunk one leaves the kept
  snapshots kept and listed; no snapshot lies outside the index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.rel_state_helpers import (
    CONFIG,
    KEPT,
    RUN,
    clone,
    failure_report,
    runs_by_stage,
    snakemake,
    store,
    workdir_after,
)
from support.workflow_runs import ROOT, SNAKEMAKE, job_counts

from pipeline_lib.spec.config import Config, ExperimentConfig, TrackingConfig
from pipeline_lib.tracking import init_parent_run, start_stage
from pipeline_lib.tracking.store import normalize_uri

SUPERSEDED = "loopline.superseded"


@pytest.fixture(autouse=True)
def _no_env_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory where the one-variant pipeline has finished."""
    return workdir_after(tmp_path_factory.mktemp("rel_state") / "base", CONFIG)


def _snapshot_dir(workdir: Path, step: int) -> Path:
    return workdir / "results" / RUN / "snapshots" / f"step_{step:07d}"


def _metrics(workdir: Path) -> list[dict]:
    path = workdir / "results" / RUN / "train" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


# ------------------------------------------------------------------ missing snapshots


@pytest.mark.slow
def test_deleted_kept_and_final_snapshots_are_rebuilt(finished: Path, tmp_path: Path) -> None:
    work = clone(finished, tmp_path / "work")
    snaps = work / "results" / RUN / "snapshots"
    data_dir = next(p for p in (work / "results" / "data").iterdir() if p.is_dir())
    untouched = {p: p.stat().st_mtime_ns for p in (data_dir / "tokens.bin",
                                                    work / "results" / RUN / "tracking.json")}
    for step in KEPT:
        shutil.rmtree(_snapshot_dir(work, step))
    assert not (snaps / "final").exists()  # dangling until the rerun

    dry = snakemake(work, "--cores", "2", "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert job_counts(dry.stdout) == {
        "train_segment_temp": 1, "train_segment": 2, "snapshot_index": 1, "eval_heff": 2,
        "summarize_heff": 1, "bench_downstream": 1, "summarize_bench": 1, "export": 1,
        "track_done": 1, "compare_runs": 1, "all": 1}  # no pack_data, tracking_store, track_init

    result = snakemake(work, "--cores", "2")
    assert result.returncode == 0, failure_report(work, result)
    for step in KEPT:  # bit-identical to the snapshots that were deleted
        for name in ("model.safetensors", "optimizer.safetensors"):
            rebuilt = (_snapshot_dir(work, step) / name).read_bytes()
            assert rebuilt == (_snapshot_dir(finished, step) / name).read_bytes(), (step, name)
    index = json.loads((snaps / "index.json").read_text())
    assert [e["step"] for e in index["kept"]] == KEPT
    assert all((snaps / e["path"] / "MANIFEST.json").is_file() for e in index["kept"])
    assert (snaps / "final").resolve() == _snapshot_dir(work, KEPT[-1]).resolve()
    assert not list((snaps / "segments").glob("step_*"))  # the temporary one went again
    losses = [(r["step"], r["loss"]) for r in _metrics(work)]
    assert losses == [(r["step"], r["loss"]) for r in _metrics(finished)]
    assert [step for step, _ in losses] == list(range(1, 7))
    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched

    # A copied run directory (its tracking.json names the original store) keeps the
    # parent's data_id, although the sweeps that reran do not know the pack.
    parent, _ = runs_by_stage(work)
    assert parent.data.tags["loopline.data_id"] == data_dir.name
    assert not parent.data.tags.get("loopline.params_changed")  # (nothing changed)
    again = snakemake(work, "--cores", "1", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


# ------------------------------------------------------------------ retention


def _snapshot_state(work: Path) -> dict[str, int]:
    """Every file under the run's snapshots/ with its mtime (what a retraining rewrites)."""
    snaps = work / "results" / RUN / "snapshots"
    return {str(p.relative_to(snaps)): p.stat().st_mtime_ns for p in snaps.rglob("*")
            if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("keep_last, says", [
    (3, "now keep step(s) 2, written as temporary snapshots (deleted once the next segment "
        "has read them): they cannot come back without retraining"),
    (1, "step(s) 4 were written as kept snapshots and stay kept (listed in "
        "snapshots/index.json), though snapshots.keep_last/keep_every no longer keep them"),
])
def test_changing_keep_last_retrains_nothing(finished: Path, tmp_path: Path, keep_last: int,
                                             says: str) -> None:
    work = clone(finished, tmp_path / "work")
    before, metrics = _snapshot_state(work), _metrics(work)
    keep = tmp_path / "keep.yaml"
    keep.write_text(f"snapshots: {{keep_last: {keep_last}}}\n")
    result = snakemake(work, "--cores", "2", configs=(keep,))
    assert result.returncode == 0, failure_report(work, result)
    out = result.stdout + result.stderr
    jobs = job_counts(out)
    # the parent run takes the new config (track_config) and is finished again: no
    # segment, no sweep, no benchmark, no index
    assert set(jobs) == {"track_config", "track_done", "all"}, jobs
    notes = [line for line in out.splitlines() if line.startswith(f"run {RUN}: ")]
    assert len(notes) == 1 and says in notes[0], notes
    assert _snapshot_state(work) == before and _metrics(work) == metrics
    snaps = work / "results" / RUN / "snapshots"
    index = json.loads((snaps / "index.json").read_text())
    on_disk = sorted(int(p.name.removeprefix("step_")) for p in snaps.glob("step_*"))
    assert [e["step"] for e in index["kept"]] == on_disk == KEPT  # no snapshot outside it
    assert not list((snaps / "transient").glob("step_*"))
    again = snakemake(work, "--cores", "1", "-n", configs=(keep,))
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-3000:]


# ------------------------------------------------------------------ stale tracking


@pytest.mark.slow
def test_config_change_updates_the_parent_and_supersedes_replaced_runs(
        finished: Path, tmp_path: Path) -> None:
    work = clone(finished, tmp_path / "work")
    before, _ = runs_by_stage(work)
    first_lr = before.data.params["train.lr"]
    # (the clone's store keeps the original's artifact location, which other clones share)
    known = {a.path for a in store(work).list_artifacts(before.info.run_id, "config")}
    change = tmp_path / "lr.yaml"
    change.write_text("train: {lr: 0.0025}\n")  # the default is 0.002
    result = snakemake(work, "--cores", "2", configs=(change,))
    assert result.returncode == 0, failure_report(work, result)
    jobs = job_counts(result.stdout + result.stderr)
    assert (jobs["track_config"], jobs["train_segment_temp"], jobs["train_segment"]) == (1, 1, 2)
    assert "pack_data" not in jobs and "track_init" not in jobs

    parent, children = runs_by_stage(work)
    assert parent.info.run_id == before.info.run_id
    tags = parent.data.tags
    assert parent.data.params["train.lr"] == first_lr != "0.0025"  # MLflow params are immutable
    assert tags["loopline.params_changed"] == "train.lr"
    assert tags["loopline.param.train.lr"] == "0.0025"
    assert tags["loopline.config_hash"] != before.data.tags["loopline.config_hash"]
    current = f"config/config_{tags['loopline.config_hash']}.yaml"
    artifacts = {a.path for a in store(work).list_artifacts(parent.info.run_id, "config")}
    assert artifacts - known == {current}
    config = yaml.safe_load(Path(store(work).download_artifacts(
        parent.info.run_id, current, str(tmp_path))).read_text())
    assert config["train"]["lr"] == 0.0025
    assert tags["loopline.data_id"] not in ("", "unknown")

    # The retrained train run is current; the first one (and each replaced sweep and
    # summary) is tagged superseded.
    for stage in ("train", "eval_heff/step_0000004", "eval_summary"):
        flags = [r.data.tags.get(SUPERSEDED) for r in children[stage]]
        assert flags == ["true", "false"], (stage, flags)
    new_train = children["train"][-1]
    history = store(work).get_metric_history(new_train.info.run_id, "train/loss")
    assert sorted(m.step for m in history) == list(range(1, 7))


def test_a_copied_run_directory_keeps_the_parents_data_id(tmp_path: Path) -> None:
    first = tmp_path / "a" / "results"
    cfg = Config(tracking=TrackingConfig(uri=f"sqlite:///{first / 'mlflow.db'}"),
                 experiment=ExperimentConfig(name="rel-copy"))
    info = init_parent_run(cfg, "base", first / "base", "0123456789ab")
    copy = tmp_path / "b" / "results"
    shutil.copytree(first, copy)
    cfg.tracking.uri = f"sqlite:///{copy / 'mlflow.db'}"
    # tracking.json in the copy names the first store: the stage finds the parent again
    # by its tags in the copy's store, without knowing the pack.
    with start_stage(cfg, copy / "base", "eval_heff/step_0000002") as stage:
        stage.log_metrics(2, {"heff/loss_h1": 1.0})
    cfg.model.vocab_size = 258  # what training's resolved config says
    start_stage(cfg, copy / "base", "train", data_id="0123456789ab").end()
    from mlflow import MlflowClient

    client = MlflowClient(normalize_uri(cfg.tracking.uri))
    parent = client.get_run(info["parent_run_id"])
    assert parent.data.tags["loopline.data_id"] == "0123456789ab"
    assert "loopline.params_changed" not in parent.data.tags
    assert parent.data.params["model.vocab_size"] == "0"
    child = client.get_run(stage.run_id)
    assert child.data.tags["mlflow.parentRunId"] == info["parent_run_id"]


def test_reverting_a_change_clears_the_changed_params(tmp_path: Path) -> None:
    cfg = Config(tracking=TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
                 experiment=ExperimentConfig(name="rel-revert"))
    first = cfg.train.lr
    info = init_parent_run(cfg, "base", tmp_path / "base", "d0")
    cfg.train.lr = first / 3
    init_parent_run(cfg, "base", tmp_path / "base", "d0")
    cfg.train.lr = first
    init_parent_run(cfg, "base", tmp_path / "base", "d0")
    from mlflow import MlflowClient

    tags = MlflowClient(normalize_uri(cfg.tracking.uri)).get_run(info["parent_run_id"]).data.tags
    assert tags["loopline.params_changed"] == ""
    assert tags["loopline.param.train.lr"] == str(first)


def test_a_rerun_stage_supersedes_only_its_own_earlier_runs(tmp_path: Path) -> None:
    cfg = Config(tracking=TrackingConfig(uri=f"sqlite:///{tmp_path / 'mlflow.db'}"),
                 experiment=ExperimentConfig(name="rel-supersede"))
    run_dir = tmp_path / "base"
    ids = {}
    for name in ("train", "eval_heff/step_0000002", "train", "train"):
        with start_stage(cfg, run_dir, name) as stage:
            ids.setdefault(name, []).append(stage.run_id)
    from mlflow import MlflowClient

    client = MlflowClient(normalize_uri(cfg.tracking.uri))
    flag = {rid: client.get_run(rid).data.tags[SUPERSEDED] for v in ids.values() for rid in v}
    assert [flag[r] for r in ids["train"]] == ["true", "true", "false"]
    assert flag[ids["eval_heff/step_0000002"][0]] == "false"


# ------------------------------------------------------------------ per-attempt logs

FLAKY_SNAKEFILE = """
rule flaky:
    output: "out.txt"
    log: "logs/flaky/one.log"
    retries: 1
    script: "flaky.py"
"""
FLAKY_SCRIPT = """
from pathlib import Path
from pipeline_lib.errors import DataError
from pipeline_lib.workflow.io import script_logging

snakemake = globals()["snakemake"]
with script_logging(snakemake.log[0]) as log:
    tries = Path("tries")
    tries.write_text(tries.read_text() + "x" if tries.exists() else "x")
    log.info("try number %d", len(tries.read_text()))
    if len(tries.read_text()) == 1:
        raise DataError("corpus.txt is unreadable (first try fails)")
    Path(snakemake.output[0]).write_text("ok")
"""


def test_a_retry_keeps_the_failed_attempts_log(tmp_path: Path) -> None:
    (tmp_path / "Snakefile").write_text(FLAKY_SNAKEFILE)
    (tmp_path / "flaky.py").write_text(FLAKY_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [str(SNAKEMAKE), "--cores", "1", "--directory", str(tmp_path), "--snakefile",
           str(tmp_path / "Snakefile")]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = tmp_path / "logs" / "flaky"
    first, second = (logs / "one.attempt1.log").read_text(), (logs / "one.attempt2.log").read_text()
    assert first.startswith("=== attempt 1:") and "try number 1" in first
    assert "corpus.txt is unreadable (first try fails)" in first and "try number 2" not in first
    assert second.startswith("=== attempt 2:") and "try number 2" in second
    assert (logs / "one.log").read_text() == second  # the declared log: the latest attempt
    assert os.path.samefile(logs / "one.log", logs / "one.attempt2.log")

    forced = subprocess.run([*cmd, "--forcerun", "flaky"], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=300)
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert sorted(p.name for p in logs.iterdir()) == [
        "one.attempt1.log", "one.attempt2.log", "one.attempt3.log", "one.log"]
    assert (logs / "one.attempt1.log").read_text() == first


def test_a_log_written_before_numbering_is_kept_as_an_attempt(tmp_path: Path) -> None:
    from pipeline_lib.workflow.io import script_logging

    log_path = tmp_path / "logs" / "job.log"
    log_path.parent.mkdir()
    log_path.write_text("an older run\n")
    with script_logging(log_path) as log:
        log.info("this run")
    assert (tmp_path / "logs" / "job.attempt1.log").read_text() == "an older run\n"
    assert "this run" in (tmp_path / "logs" / "job.attempt2.log").read_text()
