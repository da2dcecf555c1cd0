"""The final snapshot's headline metrics and logged-model spec, built from real stage outputs'
formats; the Snakefile's handler closing parents left open."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline_lib.workflow.final_results import (
    bench_values,
    heff_values,
    is_final,
    model_spec,
)

HEFF = {"step": 30, "losses": {"1": 2.5, "2": 2.25, "4": 2.375}, "best_h_eff": 2,
        "deeper_better": True, "stderr": {"1": 0.1, "2": 0.1, "4": 0.1}}
BENCH = {"step": 30, "tasks": {
    "loopline_khop": {"metric": "acc", "h_eff": {
        "1": {"overall": {"acc": 0.5, "acc_stderr": 0.05},
              "overall_ci": {"acc": {"n": 100, "ci_low": 0.4, "ci_high": 0.6}},
              "levels": {"1": {"acc": 0.7, "n": 50, "ci_low": 0.5, "ci_high": 0.8}}},
        "4": {"overall": {"acc": 0.625, "acc_stderr": 0.05},
              "overall_ci": {"acc": {"n": 100, "ci_low": 0.5, "ci_high": 0.7}}}}},
    "loopline_addition": {"metric": "exact_match", "h_eff": {
        "1": {"overall": {"exact_match": 0.25}}}}}}


def test_heff_values_put_loss_at_step_h_eff() -> None:
    assert heff_values(HEFF) == {"heff/final_loss": {1: 2.5, 2: 2.25, 4: 2.375},
                                 "heff/best_h_eff": {0: 2.0}, "heff/best_loss": {0: 2.25}}


def test_heff_values_put_label_accuracy_per_level_at_step_h_eff() -> None:
    labelled = {**HEFF, "labels": {"levels": {
        "8": {"accuracy": {"1": 0.75, "2": 1.0, "4": 1.0}},
        "32": {"accuracy": {"1": 0.5, "2": 0.625, "4": 0.875}}}}}
    values = heff_values(labelled)
    assert values["heff/label_accuracy_L8"] == {1: 0.75, 2: 1.0, 4: 1.0}
    assert values["heff/label_accuracy_L32"] == {1: 0.5, 2: 0.625, 4: 0.875}


def test_bench_values_put_scores_and_intervals_at_step_h_eff() -> None:
    assert bench_values(BENCH) == {
        "bench/loopline_khop/acc": {1: 0.5, 4: 0.625},
        "bench/loopline_khop/acc_ci_low": {1: 0.4, 4: 0.5},
        "bench/loopline_khop/acc_ci_high": {1: 0.6, 4: 0.7},
        "bench/loopline_addition/exact_match": {1: 0.25}}


def _snapshot(tmp_path: Path, step: int, total: int) -> Path:
    snap = tmp_path / "results" / "base" / "snapshots" / f"step_{step:07d}"
    snap.mkdir(parents=True)
    (snap / "trainer_state.json").write_text(json.dumps({
        "step": step, "total_steps": total, "tokens_seen": step * 512, "val_loss": 2.0,
        "tracking_run_id": "r1"}))
    (snap / "MANIFEST.json").write_text('{"files": {}}')
    return snap


def test_is_final_reads_the_snapshot_state(tmp_path: Path) -> None:
    assert is_final(_snapshot(tmp_path, 30, 30))
    assert not is_final(_snapshot(tmp_path, 20, 30))
    assert not is_final(tmp_path / "missing")


def test_model_spec_points_at_the_export_and_leaves_weights_there(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, 30, 30)
    export = tmp_path / "results" / "base" / "export"
    export.mkdir()
    (export / "config.json").write_text(json.dumps({
        "model_type": "loopline", "num_loops": 4, "hidden_size": 32,
        "auto_map": {"AutoConfig": "x"}, "loopline": {"step": 30, "weights": "model"}}))
    for name in ("model.safetensors", "tokenizer.json", "modeling_loopline.py"):
        (export / name).write_text("x")
    spec, files = model_spec("base", snap, export, {"name": "abc", "digest": "d1"})
    digest = hashlib.sha256(b'{"files": {}}').hexdigest()[:16]
    assert spec["key"] == f"base/step_0000030/{digest}/model"
    assert (spec["name"], spec["step"]) == ("base-step30", 30)
    assert spec["params"]["num_loops"] == 4 and spec["params"]["loopline.step"] == 30
    assert "auto_map.AutoConfig" in spec["params"]
    assert spec["metrics"] == {"model/val_loss": 2.0, "model/tokens_seen": 15360.0}
    assert spec["tags"]["loopline.export_dir"] == str(export.absolute())
    assert spec["dataset"] == {"name": "abc", "digest": "d1"}
    assert [f.name for f in files] == ["config.json", "modeling_loopline.py", "tokenizer.json"]


@pytest.mark.parametrize("status", ["FINISHED", "FAILED"])
def test_handler_closes_the_parents_a_pipeline_left_open(tmp_path: Path, status: str,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    from mlflow import MlflowClient

    from pipeline_lib.tracking import init_parent_run, pipeline_job
    from pipeline_lib.workflow.plan import plan_for_snakemake
    from pipeline_lib.workflow.stages.parent_runs import close_open_parents

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    plan = plan_for_snakemake({"experiment": {"results_dir": str(tmp_path / "results"),
                                              "name": "handler"}, "tracking": {"uri": uri},
                               "runs": {"a": {}, "b": {}}})
    assert close_open_parents(plan, status) == []  # nothing open: no store touched
    run_dir = plan.layout.run("a").run_dir
    cfg = plan.runs["a"].config
    with pipeline_job(cfg, run_dir):
        parent = init_parent_run(cfg, "a", run_dir, "d0")["parent_run_id"]
    assert close_open_parents(plan, status) == ["a"]
    assert MlflowClient(uri).get_run(parent).info.status == status
    assert close_open_parents(plan, status) == []
