"""End to end: the tiny config through Snakemake (pack → train in segments → eval → bench →
compare), rotation, idempotence, stage reruns, and what lands in MLflow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from support.workflow_runs import ROOT, TINY, job_counts, snakemake

pytestmark = pytest.mark.slow
RUNS = ("loops1", "loops2")
KEPT = [20, 30]  # tiny.yaml: 30 steps, segments of 10, keep_last 2 (+ final)


def test_segments_and_rotation(tiny_pipeline: Path):
    for run in RUNS:
        snaps = tiny_pipeline / "results" / run / "snapshots"
        steps = sorted(int(p.name.removeprefix("step_")) for p in snaps.glob("step_*"))
        assert steps == KEPT
        assert not list((snaps / "transient").glob("step_*")), "temporary snapshot not deleted"
        # the variant's partial override sits on tiny.yaml, not on the schema's defaults
        trained = yaml.safe_load((snaps / "step_0000030" / "config.yaml").read_text())["model"]
        assert (trained["d_model"], trained["loops"]) == (32, int(run.removeprefix("loops")))
        index = json.loads((snaps / "index.json").read_text())
        assert [e["step"] for e in index["kept"]] == KEPT
        assert (snaps / "final").resolve() == (snaps / "step_0000030").resolve()
        lines = (tiny_pipeline / "results" / run / "train" / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(x)["step"] for x in lines] == list(range(1, 31))


def test_eval_bench_and_compare_outputs(tiny_pipeline: Path):
    for run in RUNS:
        base = tiny_pipeline / "results" / run
        for step in KEPT:
            doc = json.loads((base / "eval" / "heff" / f"step_{step:07d}.json").read_text())
            assert doc["step"] == step and set(doc["losses"]) == {"1", "2", "4"}
            kl = doc["adaptive_by_criterion"]["kl"]
            assert kl["points"][0]["loss"] == doc["losses"]["4"]  # threshold 0
            assert "labels" not in doc  # an unlabelled pack
        bench = json.loads((base / "bench" / "step_0000030.json").read_text())
        assert set(bench["tasks"]) == {"loopline_khop", "loopline_addition", "loopline_parity"}
        for name in ("eval/heff.parquet", "eval/heff.png", "eval/heff_adaptive.parquet",
                     "eval/heff_adaptive.png", "eval/heff_labels.parquet", "eval/heff_labels.png",
                     "bench/summary.parquet", "bench/accuracy_vs_heff.png"):
            assert (base / name).stat().st_size > 0
        export = json.loads((base / "export" / "config.json").read_text())  # rule export
        assert export["loopline"]["step"] == 30
        assert export["num_loops"] == int(run.removeprefix("loops"))
        assert (base / "export" / "model.safetensors").stat().st_size > 0
    summary = (tiny_pipeline / "results" / "compare" / "summary.md").read_text()
    assert all(run in summary for run in RUNS)


def test_second_call_has_nothing_to_do(tiny_pipeline: Path):
    result = snakemake(tiny_pipeline, "--cores", "1", "-n")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr


def test_each_run_has_the_spec_the_main_call_resolved(tiny_pipeline: Path):
    """``{run}/specs/{digest}.yaml`` holds the run as the Snakefile's plan resolved it
    (written by onstart before the first job, named by the digest every job's params carry);
    the segments trained that config."""
    from pipeline_lib.checkpoint.compat import snapshot_config
    from pipeline_lib.spec.config_load import load_config
    from pipeline_lib.spec.config_write import to_dict
    from pipeline_lib.spec.run_spec import read_run_spec
    from pipeline_lib.workflow.plan import WorkflowPlan

    plan = WorkflowPlan(to_dict(load_config(TINY)))
    for run in RUNS:
        run_dir = tiny_pipeline / "results" / run
        digest = plan.runs[run].digest
        assert sorted(p.name for p in (run_dir / "specs").iterdir()) == [f"{digest}.yaml"]
        spec = read_run_spec(run_dir, digest)
        assert spec == plan.runs[run].spec
        trained = snapshot_config(run_dir / "snapshots" / "final")
        assert to_dict(trained.train) == to_dict(spec.config.train)
        assert trained.model.loops == spec.config.model.loops


def test_a_changed_rule_script_redoes_nothing(tiny_pipeline: Path, tmp_path: Path):
    """The rule scripts are doors: editing one (here: pack_data's and train_segment's, in a
    copy of the workflow) leaves a finished run finished (profiles/default's rerun-triggers
    leave out Snakemake's code trigger; signatures and inputs decide)."""
    wf = tmp_path / "wf"
    wf.mkdir()
    for part in ("Snakefile", "workflow", "profiles", "config"):
        src = ROOT / part
        (shutil.copytree if src.is_dir() else shutil.copyfile)(src, wf / part)
    for script in ("pack_data.py", "train_segment.py"):
        with open(wf / "workflow" / "scripts" / script, "a") as f:
            f.write("# a door edited after the run finished\n")
    result = snakemake(tiny_pipeline, "--cores", "1", "-n", snakefile=wf / "Snakefile")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr, result.stdout[-3000:]


def test_changing_eval_settings_retrains_nothing(tiny_pipeline: Path, tmp_path: Path):
    extra = tmp_path / "eval.yaml"
    extra.write_text("eval:\n  max_tokens: 1024\n")
    result = snakemake(tiny_pipeline, "--cores", "1", "-n", extra_configs=(extra,))
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = job_counts(result.stdout)
    assert jobs.get("eval_heff") == 4
    assert not any(name.startswith("train_segment") for name in jobs), jobs


def test_forcerun_eval_heff_reruns_only_the_sweep(tiny_pipeline: Path):
    result = snakemake(tiny_pipeline, "--cores", "1", "-n", "--forcerun", "eval_heff")
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = job_counts(result.stdout)
    # track_done: the runs' parent runs end (FINISHED) again once their sweeps are rebuilt
    assert set(jobs) == {"eval_heff", "summarize_heff", "track_done", "compare_runs", "all"}, jobs


def test_mlflow_runs_and_exactly_once_train_metrics(tiny_pipeline: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tiny_pipeline / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("loopline-tiny")
    runs = client.search_runs([exp.experiment_id], max_results=500)
    parents = {r.data.tags["loopline.run"]: r for r in runs
               if r.data.tags.get("loopline.role") == "parent"}
    assert set(parents) == set(RUNS)
    for parent in parents.values():
        tags = parent.data.tags
        for key in ("loopline.git_commit", "loopline.config_hash", "loopline.data_id",
                    "loopline.version.snakemake", "loopline.version.torch"):
            assert tags.get(key), key
        children = {r.data.tags.get("loopline.stage"): r for r in runs
                    if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
        assert {"pack", "train", "eval_heff/step_0000020", "eval_heff/step_0000030",
                "bench/step_0000030"} <= set(children), sorted(children)
        train = children["train"]
        history = client.get_metric_history(train.info.run_id, "train/loss")
        assert sorted(m.step for m in history) == list(range(1, 31))
        # in-training validation at every eval.h_eff (tiny.yaml: 1, 2, 4), every 10 steps, once
        lines = [json.loads(x) for x in (tiny_pipeline / "results" / parent.data.tags[
            "loopline.run"] / "train" / "metrics.jsonl").read_text().splitlines()]
        for h in (1, 2, 4):
            val = client.get_metric_history(train.info.run_id, f"val/loss_h{h}")
            assert sorted(m.step for m in val) == [10, 20, 30], h
            assert {m.step: m.value for m in val} == pytest.approx(
                {m["step"]: m[f"val/loss_h{h}"] for m in lines if f"val/loss_h{h}" in m})
        heff = children["eval_heff/step_0000030"].data.metrics
        assert {"heff/loss_h1", "heff/loss_h2", "heff/loss_h4", "heff/best_h"} <= set(heff)
        bench = children["bench/step_0000030"].data.metrics
        assert any(k.startswith("bench/loopline_khop/") for k in bench)
        assert client.list_artifacts(parent.info.run_id, "config")


def test_job_benchmarks_under_logs_and_tracked(tiny_pipeline: Path):
    """Snakemake's benchmark TSVs go to logs/benchmarks/{rule}/ (benchmarks/ holds scripts
    only) and are attached to the stage summaries' MLflow runs."""
    from mlflow.tracking import MlflowClient

    assert not (tiny_pipeline / "benchmarks").exists()
    tsvs = tiny_pipeline / "logs" / "benchmarks"
    for run in RUNS:
        assert sorted(p.name for p in (tsvs / "eval_heff" / run).glob("*.tsv")) == [
            f"step_{s:07d}.tsv" for s in KEPT]
        assert len(list((tsvs / "train_segment" / run).rglob("*.tsv"))) == 3
    assert len(list((tsvs / "pack_data").glob("*.tsv"))) == 1
    client = MlflowClient(f"sqlite:///{tiny_pipeline / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("loopline-tiny")
    summary = next(r for r in client.search_runs([exp.experiment_id], max_results=500)
                   if r.data.tags.get("loopline.stage") == "eval_summary")
    attached = {a.path for a in client.list_artifacts(summary.info.run_id, "benchmarks")}
    assert {"benchmarks/step_0000020.tsv", "benchmarks/step_0000030.tsv"} <= attached


def test_slurm_profile_dry_run(tiny_pipeline: Path):
    result = snakemake(tiny_pipeline, "-n", "--profile", str(Path(__file__).resolve().parents[2]
                                                                / "profiles" / "slurm"),
                       "--forcerun", "train_segment")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "cpus_per_task=1" in result.stdout and "runtime=" in result.stdout


def test_report_collects_the_plots(tiny_pipeline: Path):
    result = snakemake(tiny_pipeline, "--report", str(tiny_pipeline / "report.html"))
    assert result.returncode == 0, result.stderr[-3000:]
    html = (tiny_pipeline / "report.html").read_text(errors="replace")
    for name in ("heff.png", "heff_adaptive.png", "accuracy_vs_heff.png", "loss_vs_heff.png"):
        assert name in html, name


# A tracking store moved away under Snakemake (issue 21): the next stage fails in one line.
# Every job first goes through the pipeline-job wrapper (parent run RUNNING) and the
# Snakefile's onerror handler (open parents FAILED); neither may touch the store before it is
# checked, or MLflow would create a fresh, empty one where the old one was moved away.

def _copy_of(tiny_pipeline: Path, to: Path) -> Path:
    """A copy of the finished pipeline whose tracking.json files name the copy's store."""
    work = Path(shutil.copytree(tiny_pipeline, to, symlinks=True))
    for info in (work / "results").glob("*/tracking.json"):
        info.write_text(info.read_text().replace(str(tiny_pipeline), str(work)))
    return work


def test_a_moved_store_fails_the_next_stage_in_one_line_and_makes_no_fresh_store(
        tiny_pipeline: Path, tmp_path: Path) -> None:
    work = _copy_of(tiny_pipeline, tmp_path / "work")
    db = work / "results" / "mlflow.db"
    db.rename(work / "moved.db")
    runs = sorted(p.parent.name for p in (work / "results").glob("*/tracking.json"))
    outboxes = {run: sorted((work / "results" / run).rglob("*outbox*")) for run in runs}

    result = snakemake(work, "--cores", "1", "--forcerun", "eval_heff")

    assert result.returncode != 0
    logs = [p for p in sorted((work / "logs" / "eval_heff").rglob("*.log"))
            if ".attempt" not in p.name]  # each job's log, not the copies kept per attempt
    failed = [p for p in logs if " ERROR " in p.read_text()]
    assert len(failed) == 1, result.stderr[-3000:]
    text = failed[0].read_text()
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert len(errors) == 1, text
    assert f"tracking store {db} is missing" in errors[0]
    assert "names parent run" in errors[0] and "track-init" in errors[0], errors[0]
    assert "Traceback" not in text and "Traceback" not in result.stderr
    assert f"ERROR pipeline_lib.script: tracking store {db} is missing" in result.stderr
    assert not db.exists()  # no fresh store where the old one was
    assert {run: sorted((work / "results" / run).rglob("*outbox*")) for run in runs} == outboxes
    for run in runs:  # every parent still named as it was: nothing recreated elsewhere
        info = json.loads((work / "results" / run / "tracking.json").read_text())
        original = json.loads((tiny_pipeline / "results" / run / "tracking.json").read_text())
        assert info["parent_run_id"] == original["parent_run_id"]
