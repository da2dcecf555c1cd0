"""resolve_run is the one place a run's config is completed; each job reads the spec file its
params name (by digest), and a cluster job's plan reads the files the main call named."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from pipeline_lib.commands._common import CONFIG, run_spec_from_args
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.config_write import config_hash, to_dict
from pipeline_lib.spec.names import BYTE_VOCAB_SIZE
from pipeline_lib.spec.run_spec import SpecRef, read_run_spec, spec_path, write_run_spec
from pipeline_lib.spec.signatures import train_signature
from pipeline_lib.workflow.io import run_config, run_spec
from pipeline_lib.workflow.plan import WorkflowPlan
from pipeline_lib.workflow.resolve import resolve_run
from pipeline_lib.workflow.run_specs import SPECS_ENV, encode_digests, planned_digests

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
    assert fixed.config.train.total_steps == 40  # the byte tokenizer's vocabulary, filled in
    assert fixed.vocab_size == fixed.config.model.vocab_size == BYTE_VOCAB_SIZE
    bpe = resolve_run(load_config(_config_file(tmp_path), ["data.tokenizer.type=bpe"]),
                      "budget")  # its size is the pack's (metadata.json), read by the segment
    assert bpe.vocab_size == bpe.config.model.vocab_size == 0
    assert bpe.config.train.total_steps > spec.config.train.total_steps  # counted at 1024
    base = resolve_run(cfg)
    assert base.name == "default" and base.config.runs == cfg.runs
    with pytest.raises(ConfigError, match="unknown run 'nope'"):
        resolve_run(cfg, "nope")


def test_the_filled_vocabulary_keeps_the_signatures_of_finished_runs(tmp_path: Path) -> None:
    """model.vocab_size filled in by resolve_run is hashed as the config wrote it (0): the
    train and config signatures are those of the code that left it to the trainer, so a
    finished run's results directory reruns nothing."""
    plan = _plan(tmp_path)
    for name in plan.run_names:
        spec = plan.runs[name].spec
        assert spec.config.model.vocab_size == spec.vocab_size == BYTE_VOCAB_SIZE
        written = dataclasses.replace(spec.config, model=dataclasses.replace(
            spec.config.model, vocab_size=0))
        assert plan.train_signature(name) == train_signature(written, spec.data_id)
        assert plan.config_signature(name) == config_hash(to_dict(written))
        wider = dataclasses.replace(spec.config, model=dataclasses.replace(
            spec.config.model, vocab_size=300))  # a vocabulary of the config's own still counts
        assert train_signature(wider, spec.data_id, spec.vocab_size) != \
            plan.train_signature(name)


def test_the_plan_and_the_command_line_resolve_the_same_spec(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    parser = argparse.ArgumentParser()
    for option in CONFIG:
        option.add_to(parser)
    for name in ("loops1", "budget"):
        args = parser.parse_args(["--config", str(_config_file(tmp_path)), "--run", name])
        assert run_spec_from_args(args) == plan.runs[name].spec
        assert plan.runs[name].config.train.total_steps == plan.runs[name].segment_ends[-1]


def _job(plan: WorkflowPlan, run: str, config: dict, ref: SpecRef | None = None
         ) -> SimpleNamespace:
    params = SimpleNamespace(run=run, run_dir=plan.run_dir(run), spec=ref or plan.spec_ref(run))
    return SimpleNamespace(config=config, params=params, rule="eval_heff")


def test_a_job_reads_its_spec_and_plans_nothing(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    assert sorted(plan.write_run_specs()) == sorted(plan.run_dir(r) for r in plan.run_names)
    assert plan.write_run_specs() == []  # unchanged: not rewritten
    # a config no plan could be built from: the job does not build one
    broken = {"train": {"total_steps": "many"}, "runs": "not a mapping"}
    for name in plan.run_names:
        assert plan.spec_ref(name) == SpecRef(name, plan.runs[name].spec.digest)
        assert run_spec(_job(plan, name, broken)) == plan.runs[name].spec
        assert run_config(_job(plan, name, broken)) == plan.runs[name].config
    wrong = _job(plan, "budget", {}, ref=plan.spec_ref("loops1"))
    with pytest.raises(ConfigError, match="gives no spec of run 'budget'"):
        run_spec(wrong)
    # the spec of run loops1 under run budget's name and directory
    loops1 = plan.runs["loops1"].spec
    write_run_spec(loops1, plan.run_dir("budget"))
    with pytest.raises(ConfigError, match="is the spec of run 'loops1', not of 'budget'"):
        run_spec(_job(plan, "budget", {}, ref=SpecRef("budget", loops1.digest)))


def test_a_second_call_with_another_config_changes_no_spec_of_the_first(tmp_path: Path) -> None:
    """Two Snakemake calls in one working directory (say, one per run, outputs apart): each
    plan writes every run's spec, and each job reads the one its own call planned."""
    first = _plan(tmp_path)
    first.write_run_specs()
    config = to_dict(load_config(_config_file(tmp_path)))
    config["train"]["lr"] = 0.005  # the second call's config differs for every run
    second = WorkflowPlan(config)
    assert second.write_run_specs() == [second.run_dir(r) for r in second.run_names]
    for name in first.run_names:
        assert first.spec_ref(name) != second.spec_ref(name)
        assert run_spec(_job(first, name, {})).config.train.lr == first.runs[name].config.train.lr
        assert run_spec(_job(second, name, {})).config.train.lr == 0.005


def test_a_job_gets_the_tracking_credentials_back_from_its_config(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    secret = "http://alice:s3cret@mlflow.example:5000"
    spec = plan.runs["loops1"].spec
    public = spec.with_tracking_uri(secret)  # what the plan would hold under that URI
    write_run_spec(public, plan.run_dir("loops1"))
    assert "s3cret" not in spec_path(plan.run_dir("loops1"), public.digest).read_text()
    job = _job(plan, "loops1", {"tracking": {"uri": secret}}, SpecRef("loops1", public.digest))
    assert run_spec(job).config.tracking.uri == spec.config.tracking.uri  # another store
    redacted = _with_uri(spec, "http://mlflow.example:5000")
    write_run_spec(redacted, plan.run_dir("loops1"))
    job = _job(plan, "loops1", {"tracking": {"uri": secret}}, SpecRef("loops1", redacted.digest))
    assert run_spec(job).config.tracking.uri == secret


def _with_uri(spec, uri):
    import dataclasses

    tracking = dataclasses.replace(spec.config.tracking, uri=uri)
    return dataclasses.replace(spec, config=dataclasses.replace(spec.config, tracking=tracking))


def test_a_cluster_job_plan_reads_the_specs_the_main_call_named(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    plan.write_run_specs()
    saved = read_run_spec(plan.run_dir("loops1"), plan.runs["loops1"].digest)
    marked = _with_uri(saved, "file:///marked")  # tells the file's spec from a resolved one
    write_run_spec(marked, plan.run_dir("loops1"))
    config = to_dict(load_config(_config_file(tmp_path)))
    in_job = WorkflowPlan(config, planned={"loops1": marked.digest})
    assert in_job.runs["loops1"].spec == marked
    assert in_job.spec_ref("loops1") == SpecRef("loops1", marked.digest)
    assert in_job.runs["budget"].spec == plan.runs["budget"].spec  # none named: resolved
    # a digest whose file the main call did not write: one line, before any job
    with pytest.raises(ConfigError, match="specs/0123456789abcdef.yaml does not exist"):
        WorkflowPlan(config, planned={"loops1": "0123456789abcdef"})
    write_run_spec(marked, plan.run_dir("budget"))  # run loops1's spec in budget's directory
    with pytest.raises(ConfigError, match="is the spec of run 'loops1', not of 'budget'"):
        WorkflowPlan(config, planned={"budget": marked.digest})


def test_the_main_call_hands_its_digests_down_in_the_environment() -> None:
    digests = {"loops1": "0123456789abcdef", "budget": "fedcba9876543210"}
    assert planned_digests({SPECS_ENV: encode_digests(digests)}) == digests
    assert planned_digests({}) == {}
    with pytest.raises(ConfigError, match=f"environment variable {SPECS_ENV} = 'loops1=zz'"):
        planned_digests({SPECS_ENV: "loops1=zz"})
