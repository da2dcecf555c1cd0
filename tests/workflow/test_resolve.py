"""resolve_run is the one place a run's config is completed; jobs read its run_spec.yaml."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline_lib.commands._common import add_config_args, run_spec_from_args
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import load_config, to_dict
from pipeline_lib.spec.names import BYTE_VOCAB_SIZE
from pipeline_lib.spec.run_spec import read_run_spec, run_spec_path, write_run_spec
from pipeline_lib.workflow.io import run_config, run_spec
from pipeline_lib.workflow.plan import WorkflowPlan
from pipeline_lib.workflow.resolve import resolve_run

VARIANTS = {"runs": {"loops1": {"model": {"loops": 1}},
                     "budget": {"train": {"total_steps": 0}, "model": {"loops": 2}}}}


def _config_file(tmp_path: Path) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump({"experiment": {"results_dir": str(tmp_path / "results")},
                                    "train": {"total_steps": 40, "steps_per_segment": 20},
                                    **VARIANTS}))
    return path


def _plan(tmp_path: Path) -> WorkflowPlan:
    return WorkflowPlan(to_dict(load_config(_config_file(tmp_path))))


def test_resolve_run_completes_variant_and_budget(tmp_path: Path) -> None:
    cfg = load_config(_config_file(tmp_path))
    spec = resolve_run(cfg, "budget")
    assert spec.name == "budget" and spec.config.runs == {}
    assert spec.config.model.loops == 2 and spec.vocab_size == BYTE_VOCAB_SIZE
    assert spec.config.train.total_steps > 0  # the token budget, decided here
    fixed = resolve_run(cfg, "loops1")
    assert fixed.config.train.total_steps == 40 and fixed.vocab_size == 0  # the pack decides
    base = resolve_run(cfg)
    assert base.name == "default" and base.config.runs == cfg.runs
    with pytest.raises(ConfigError, match="unknown run 'nope'"):
        resolve_run(cfg, "nope")


def test_the_plan_and_the_command_line_resolve_the_same_spec(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    for name in ("loops1", "budget"):
        args = parser.parse_args(["--config", str(_config_file(tmp_path)), "--run", name])
        assert run_spec_from_args(args) == plan.runs[name].spec
        assert plan.runs[name].config.train.total_steps == plan.runs[name].segment_ends[-1]


def _job(plan: WorkflowPlan, run: str, config: dict) -> SimpleNamespace:
    return SimpleNamespace(config=config, params=SimpleNamespace(run=run,
                                                                 run_dir=plan.run_dir(run)))


def test_a_job_reads_its_spec_and_plans_nothing(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert sorted(plan.write_run_specs()) == sorted(plan.run_dir(r) for r in plan.run_names)
    assert plan.write_run_specs() == []  # unchanged: not rewritten
    # a config no plan could be built from: the job does not build one
    broken = {"train": {"total_steps": "many"}, "runs": "not a mapping"}
    for name in plan.run_names:
        assert run_spec(_job(plan, name, broken)) == plan.runs[name].spec
        assert run_config(_job(plan, name, broken)) == plan.runs[name].config
    wrong = SimpleNamespace(config={}, params=SimpleNamespace(run="budget",
                                                              run_dir=plan.run_dir("loops1")))
    with pytest.raises(ConfigError, match="spec of run 'loops1', not of 'budget'"):
        run_spec(wrong)


def test_a_job_gets_the_tracking_credentials_back_from_its_config(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    secret = "http://alice:s3cret@mlflow.example:5000"
    spec = plan.runs["loops1"].spec
    public = spec.with_tracking_uri(secret)  # what the plan would hold under that URI
    write_run_spec(public, plan.run_dir("loops1"))
    assert "s3cret" not in run_spec_path(plan.run_dir("loops1")).read_text()
    job = _job(plan, "loops1", {"tracking": {"uri": secret}})
    assert run_spec(job).config.tracking.uri == spec.config.tracking.uri  # another store
    redacted = "http://mlflow.example:5000"
    write_run_spec(_with_uri(spec, redacted), plan.run_dir("loops1"))
    assert run_spec(job).config.tracking.uri == secret


def _with_uri(spec, uri):
    import dataclasses

    tracking = dataclasses.replace(spec.config.tracking, uri=uri)
    return dataclasses.replace(spec, config=dataclasses.replace(spec.config, tracking=tracking))


def test_a_cluster_job_plan_reads_the_saved_specs(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.write_run_specs()
    saved = read_run_spec(plan.run_dir("loops1"))
    marked = _with_uri(saved, "file:///marked")  # tells the file's spec from a resolved one
    write_run_spec(marked, plan.run_dir("loops1"))
    config = to_dict(load_config(_config_file(tmp_path)))
    in_job = WorkflowPlan(config, saved_specs=True)
    assert in_job.runs["loops1"].spec == marked
    assert in_job.runs["budget"].spec == plan.runs["budget"].spec
    run_spec_path(plan.run_dir("budget")).unlink()  # none written: resolved in the job
    assert WorkflowPlan(config, saved_specs=True).runs["budget"].spec == plan.runs["budget"].spec
