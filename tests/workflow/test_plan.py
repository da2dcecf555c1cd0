"""What the Snakefile is told: runs, data ids, kept/temporary snapshot paths, signatures."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.config_write import to_dict
from pipeline_lib.spec.names import BYTE_VOCAB_SIZE
from pipeline_lib.workflow.plan import WorkflowPlan


def _plan(*overrides: str) -> WorkflowPlan:
    return WorkflowPlan(to_dict(load_config(None, list(overrides))))


def test_kept_and_temporary_snapshot_paths():
    plan = _plan("train.total_steps=50", "train.steps_per_segment=10", "snapshots.keep_last=1",
                 "snapshots.keep_every=20")
    run = plan.run_names[0]
    assert plan.runs[run].segment_ends == [10, 20, 30, 40, 50]
    assert plan.runs[run].kept_steps == [20, 40, 50]
    assert plan.snapshot_path(run, 20).endswith(f"{run}/snapshots/step_0000020")
    assert plan.snapshot_path(run, 30).endswith(f"{run}/snapshots/transient/step_0000030")
    assert plan.previous_snapshot(run, 10) == []
    assert plan.previous_snapshot(run, 40) == [plan.snapshot_path(run, 30)]
    with pytest.raises(ValueError):
        plan.snapshot_path(run, 35)
    with pytest.raises(ConfigError, match="not a segment end"):
        plan.previous_snapshot(run, 35)
    assert plan.anchors(run) == []  # short temporary chains need none


def test_snapshots_written_keep_their_paths_when_the_retention_changes(tmp_path):
    """A finished run (kept 40, 50 of five segments; keep_last 2): growing keep_last leaves
    the deleted temporary ones temporary (no target to rebuild, the next segment's input path
    unchanged), shrinking it leaves the kept ones kept and listed; one line says each."""
    results = tmp_path / "results"
    common = ["train.total_steps=50", "train.steps_per_segment=10",
              f"experiment.results_dir={results}"]
    run = _plan(*common).run_names[0]
    for step in (40, 50):
        (results / run / "snapshots" / f"step_{step:07d}").mkdir(parents=True)
    finished = _plan(*common, "snapshots.keep_last=2")
    assert finished.runs[run].kept_steps == [40, 50] and finished.retention_notes() == []
    grown = _plan(*common, "snapshots.keep_last=4")
    assert grown.runs[run].kept_steps == [40, 50]
    assert [grown.snapshot_path(run, s) for s in (20, 30, 40)] == \
        [finished.snapshot_path(run, s) for s in (20, 30, 40)]
    assert grown.previous_snapshot(run, 40)[0].endswith("snapshots/transient/step_0000030")
    assert grown.kept_snapshots(run) == finished.kept_snapshots(run)
    (note,) = grown.retention_notes()
    assert note.startswith(f"run {run}: snapshots.keep_last/keep_every now keep step(s) 20, 30,")
    shrunk = _plan(*common, "snapshots.keep_last=1")
    assert shrunk.runs[run].kept_steps == [40, 50]
    assert shrunk.snapshot_path(run, 40).endswith("snapshots/step_0000040")
    assert shrunk.heff_results(run) == finished.heff_results(run)
    (note,) = shrunk.retention_notes()
    assert note.startswith(f"run {run}: step(s) 40 were written as kept snapshots and stay kept")
    # a run not started yet follows the settings
    fresh = _plan(*common[:2], f"experiment.results_dir={tmp_path / 'other'}",
                  "snapshots.keep_last=4")
    assert fresh.runs[run].kept_steps == [20, 30, 40, 50]


def test_long_temporary_chains_get_anchors_and_targets_come_in_step_order():
    plan = _plan("train.total_steps=3000", "train.steps_per_segment=10", "snapshots.keep_last=1",
                 "snapshots.keep_every=0", "experiment.results_dir=out")
    run = plan.run_names[0]
    assert plan.runs[run].kept_steps == [3000]
    assert plan.runs[run].anchor_steps == [1000, 2000]  # every 100th temporary segment
    assert plan.anchors(run) == [f"out/{run}/train/anchors/step_{s:07d}.tsv" for s in (1000, 2000)]
    # anchors, then the final snapshot: Snakemake resolves each chain of 100 in turn
    assert plan.run_targets(run)[:3] == [*plan.anchors(run), plan.snapshot_path(run, 3000)]
    assert plan.snapshot_path(run, 1000).endswith("snapshots/transient/step_0001000")
    mixed = _plan("train.total_steps=3000", "train.steps_per_segment=10", "snapshots.keep_last=1",
                  "snapshots.keep_every=1500", "experiment.results_dir=out")
    assert mixed.runs[run].anchor_steps == [1000, 2500]
    assert mixed.segment_targets(run) == [
        mixed.anchors(run)[0], mixed.snapshot_path(run, 1500), mixed.anchors(run)[1],
        mixed.snapshot_path(run, 3000)]


def test_snakemake_configfiles_merge_like_the_cli(tmp_path):
    """``snakemake --configfile tiny.yaml my.yaml --config train={…}``: Snakemake's own
    merge adds my.yaml's variants to tiny.yaml's; the plan has loopline's, the same as
    ``python -m pipeline_lib pack --config tiny.yaml --config my.yaml train.…=…``."""
    from snakemake.cli import parse_config
    from snakemake.settings.types import ConfigSettings

    from pipeline_lib.cli import build_parser
    from pipeline_lib.commands._common import config_from_args
    from pipeline_lib.workflow.plan import plan_for_snakemake
    from pipeline_lib.workflow.resolve import resolve_run

    tiny = Path(__file__).resolve().parents[2] / "config" / "experiments" / "tiny.yaml"
    mine = tmp_path / "my.yaml"
    mine.write_text("train: {lr: 0.002, total_steps: 40}\n"
                    "runs:\n  mine: {model: {loops: 3}}\n")
    settings = ConfigSettings(configfiles=[tiny, mine],
                              config=parse_config(["train={total_steps: 20}"]))
    config = copy.deepcopy(settings.overwrite_config)  # what the Snakefile is given
    assert set(config["runs"]) == {"loops1", "loops2", "mine"}
    plan = plan_for_snakemake(config, settings.configfiles, settings.config)
    args = build_parser().parse_args(["pack", "--config", str(tiny), "--config", str(mine),
                                      "train.total_steps=20", "--out", str(tmp_path)])
    assert to_dict(resolve_run(plan.config).config) == to_dict(config_from_args(args))
    assert plan.run_names == ["mine"]
    cfg = plan.runs["mine"].config
    assert (cfg.model.loops, cfg.model.d_model, cfg.train.lr, cfg.train.total_steps) == \
        (3, 32, 0.002, 20)  # the variant, tiny.yaml, my.yaml, --config (last)
    assert config["runs"] == {"mine": {"model": {"loops": 3}}}  # the Snakefile's, in place


def test_targets_and_inputs_come_from_the_run_layout():
    plan = _plan("train.total_steps=50", "train.steps_per_segment=10", "snapshots.keep_last=1",
                 "snapshots.keep_every=20", "experiment.results_dir=out", "bench.snapshots=final")
    run = plan.run_names[0]
    layout = plan.run_layout(run)
    assert layout.run_dir.as_posix() == plan.run_dir(run) == f"out/{run}"
    assert plan.heff_results(run) == [f"out/{run}/eval/heff/step_{s:07d}.json"
                                      for s in (20, 40, 50)]
    assert plan.bench_results(run) == [f"out/{run}/bench/step_0000050.json"]
    assert plan.compare_inputs()[f"{run}_bench"] == f"out/{run}/bench/step_0000050.json"
    assert plan.compare_inputs()[f"{run}_index"] == f"out/{run}/snapshots/index.json"
    assert plan.compare_inputs()[f"{run}_sweep"] == f"out/{run}/eval/heff/step_0000050.json"
    assert plan.metrics_files()[run] == f"out/{run}/train/metrics.jsonl"
    assert plan.all_targets()[-1] == "out/compare/summary.md"
    assert f"out/{run}/bench/accuracy_vs_heff.png" in plan.all_targets()
    assert plan.data_dir(run) == f"out/data/{plan.runs[run].data_id}"


def test_trajectories_are_never_a_target_of_all():
    """Only the target rule ``trajectories`` asks for them (the Snakemake dry runs:
    tests/workflow/test_trajectories_rule.py)."""
    plan = _plan("train.total_steps=50", "train.steps_per_segment=10")
    assert not any("trajectories" in target for target in plan.all_targets())


def test_variants_share_a_data_pack_when_only_the_model_differs():
    plan = _plan()
    assert len(plan.run_names) >= 2 and len({p.data_id for p in plan.runs.values()}) == 1
    assert plan.runs["loop1"].config.model.loops == 1
    assert plan.runs["loop1"].config.runs == {}


def test_train_signature_ignores_eval_and_bench_but_not_training():
    base = _plan()
    run = base.run_names[0]
    assert _plan("eval.max_tokens=5", "bench.h_eff=[1]").train_signature(run) == \
        base.train_signature(run)
    assert _plan("train.lr=0.01").train_signature(run) != base.train_signature(run)
    assert _plan("eval.max_tokens=5").eval_signature(run) != base.eval_signature(run)


def test_recurrence_and_noise_retrain_but_plain_keeps_the_old_signature():
    """``model.recurrence`` came after runs were made: at plain it is left out of the hash
    (the signatures of every shipped config are those of the code before the key)."""
    from pipeline_lib.spec.signatures import model_signature

    base = _plan()
    run = base.run_names[0]
    assert "recurrence" not in model_signature(base.runs[run].config.model)
    assert _plan("model.recurrence=plain").train_signature(run) == base.train_signature(run)
    assert _plan("model.recurrence=gated").train_signature(run) != base.train_signature(run)
    assert _plan("model.state_init=noise").train_signature(run) != base.train_signature(run)


def test_precision_reruns_train_eval_and_bench_but_auto_keeps_old_signatures():
    from pipeline_lib.spec.config_write import config_hash

    base = _plan()
    run = base.run_names[0]
    cfg = base.runs[run].config
    assert base.eval_signature(run) == config_hash(to_dict(cfg.eval))  # as before the key
    bench = {k: v for k, v in to_dict(cfg.bench).items() if k != "sampling"}
    assert base.bench_signature(run) == config_hash(bench)  # bench.sampling off: as before it
    assert _plan("bench.sampling.repeats=5").bench_signature(run) != base.bench_signature(run)
    assert _plan("experiment.precision=auto").train_signature(run) == base.train_signature(run)
    bf16 = _plan("experiment.precision=bf16")
    for signature in ("train_signature", "eval_signature", "bench_signature"):
        assert getattr(bf16, signature)(run) != getattr(base, signature)(run), signature
        assert getattr(bf16, signature)(run) != \
            getattr(_plan("experiment.precision=fp32"), signature)(run), signature


def test_token_budget_fills_in_total_steps():
    plan = _plan("train.total_steps=0", "train.token_budget_multiplier=1")
    cfg = plan.runs[plan.run_names[0]].config
    from pipeline_lib.spec.size import param_count

    params = param_count(dataclasses.replace(cfg.model, vocab_size=BYTE_VOCAB_SIZE))
    expected = -(-params // (cfg.data.seq_len * cfg.train.global_batch_rows))
    assert cfg.train.total_steps == expected


def test_token_budget_of_a_file_tokenizer_reads_its_vocabulary(tmp_path):
    from tokenizers import Tokenizer, models

    from pipeline_lib.errors import DataError
    from pipeline_lib.spec.size import param_count

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(1000)}, unk_token="w0"))
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    file_tok = ["data.tokenizer.type=file", f"data.tokenizer.path={tmp_path / 'tokenizer.json'}"]
    plan = _plan("train.total_steps=0", "train.token_budget_multiplier=1", *file_tok)
    cfg = plan.runs[plan.run_names[0]].config
    assert cfg.model.vocab_size == plan.runs[plan.run_names[0]].spec.vocab_size == 1001
    params = param_count(cfg.model)
    assert cfg.train.total_steps == -(-params // (cfg.data.seq_len * cfg.train.global_batch_rows))
    gone = ["data.tokenizer.type=file", f"data.tokenizer.path={tmp_path / 'gone.json'}"]
    for steps in ("train.total_steps=7", "train.total_steps=0"):  # model.vocab_size needs it
        with pytest.raises(DataError, match="gone.json does not exist"):
            _plan(steps, *gone)


def test_cluster_resources_only_name_what_is_set():
    plan = _plan("resources.slurm_partition=gpu", "resources.train_gpus=2")
    assert plan.cluster_resources("train") == {"cpus_per_task": 1, "mem_mb": 4000, "gpu": 2,
                                               "runtime": 60, "slurm_partition": "gpu"}
    assert "gpu" not in plan.cluster_resources("eval")
    assert plan.cluster_resources("eval")["runtime"] == 60


def test_segments_of_variants_with_other_timing_get_theirs():
    from types import SimpleNamespace

    plan = _plan("runs.quick.train.stop_margin_minutes=0",
                 "runs.quick.train.segment_runtime_minutes=30")
    time = plan.segment_time()
    other = next(r for r in plan.run_names if r != "quick")
    assert time["runtime"](SimpleNamespace(run="quick")) == 30
    assert time["slurm_extra"](SimpleNamespace(run="quick")) == ""  # no early signal
    assert time["runtime"](SimpleNamespace(run=other)) == 60
    assert time["slurm_extra"](SimpleNamespace(run=other)) == "--signal=USR1@300"
    assert _plan().segment_time() == {"runtime": 60, "slurm_extra": "--signal=USR1@300"}


def _sbatch(resources: dict, threads: int = 1) -> str:
    """The sbatch line the SLURM executor plugin builds from ``resources`` (its own code)."""
    from types import SimpleNamespace

    from snakemake.iocontainers import Namedlist
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    job = SimpleNamespace(resources=Namedlist(fromdict=resources), threads=threads)
    params = {"run_uuid": "u", "slurm_logfile": "l", "comment_str": "c", "account": "",
              "partition": "", "workdir": ""}
    return get_submit_command(job, params) + set_gres_string(job)


@pytest.mark.parametrize("nproc, gpus, wanted, unwanted", [
    (4, 4, ["--nodes=2", "--ntasks-per-node=4", "--gres=gpu:4", "--cpus-per-task=4"],
     ["--ntasks-per-gpu", "--gpus="]),
    (1, 1, ["--nodes=2", "--ntasks=2", "--gres=gpu:1", "--cpus-per-task=16"],
     ["--ntasks-per-gpu", "--gpus="]),
    (2, 0, ["--nodes=2", "--ntasks-per-node=2", "--cpus-per-task=8"], ["--gres", "--gpus"]),
])
def test_multi_node_segments_ask_slurm_for_nodes_and_tasks(nproc, gpus, wanted, unwanted):
    plan = _plan("train.nnodes=2", f"train.nproc={nproc}", f"resources.train_gpus={gpus}",
                 "resources.train_cpus=16", f"train.global_batch_rows={8 * nproc}",
                 "train.micro_batch_rows=4")
    res = plan.cluster_resources("train")
    assert res["nodes"] == 2 and res["mpi"] == "srun" and "gpu" not in res
    line = _sbatch(res).split()
    for option in wanted:
        assert option in line, (option, line)
    for option in unwanted:
        assert not any(word.startswith(option) for word in line), (option, line)
    assert "nodes" not in plan.cluster_resources("eval")


def test_going_on_with_fewer_nodes_asks_slurm_not_to_end_the_job_on_a_failed_node():
    plan = _plan("train.nnodes=3", "train.min_nnodes=2", "train.global_batch_rows=48",
                 "train.micro_batch_rows=8")
    assert plan.segment_time() == {"runtime": 60, "slurm_extra": "--signal=USR1@300 --no-kill"}
    assert "--no-kill" in _sbatch({**plan.cluster_resources("train"), **plan.segment_time()})
    same = _plan("train.nnodes=3", "train.min_nnodes=3", "train.global_batch_rows=48",
                 "train.micro_batch_rows=8")
    assert same.segment_time()["slurm_extra"] == "--signal=USR1@300"  # nothing to go on with


@pytest.mark.parametrize("overrides, pattern", [
    (["train.nnodes=2", "train.min_nnodes=3", "train.micro_batch_rows=2"],
     r"train.min_nnodes = 3 exceeds train.nnodes = 2; use at most 2"),
    # 16 rows split over 2 and 4 nodes of one process, not over 3: lcm(2, 3, 4) × 8 rows
    (["train.nnodes=4", "train.min_nnodes=2", "train.micro_batch_rows=2",
      "train.global_batch_rows=16"],
     r"global_batch_rows = 16 does not split over every node count from train.min_nnodes = "
     r"2 to train.nnodes = 4 .* use a multiple of 24, or raise train.min_nnodes"),
])
def test_the_fewest_nodes_must_fit_the_nodes_and_the_batch(overrides, pattern):
    from pipeline_lib.errors import ConfigError

    with pytest.raises(ConfigError, match=pattern):
        load_config(None, overrides)
    fits = ["train.nnodes=4", "train.min_nnodes=2", "train.micro_batch_rows=2",
            "train.global_batch_rows=24"]
    assert load_config(None, fits).train.min_nnodes == 2


def test_variants_cannot_change_the_nodes_of_a_multi_node_run(tmp_path):
    from pipeline_lib.errors import ConfigError

    cfg = to_dict(load_config(None, ["train.nnodes=2", "train.global_batch_rows=64"]))
    cfg["runs"] = {"wide": {"train": {"nnodes": 4}}}
    with pytest.raises(ConfigError, match=r"runs.wide sets train.nnodes × train.nproc = 4 × 1"):
        WorkflowPlan(cfg)


def test_bench_snapshots_final_or_kept():
    final = _plan("train.total_steps=30", "train.steps_per_segment=10", "snapshots.keep_last=2")
    kept = _plan("train.total_steps=30", "train.steps_per_segment=10", "snapshots.keep_last=2",
                 "bench.snapshots=kept")
    run = final.run_names[0]
    assert final.bench_steps(run) == [30]
    assert kept.bench_steps(run) == [20, 30]


def test_bench_tasks_are_checked_and_user_task_files_are_bench_inputs(tmp_path):
    from user_task_helpers import write_user_tasks

    from pipeline_lib.errors import ConfigError

    user = write_user_tasks(tmp_path / "my_tasks")
    plan = _plan(f"bench.include_path={user}")
    for run in plan.run_names:
        files = plan.bench_task_files(run)
        assert str(user / "pointer.yaml") in files and str(user / "gen" / "echo.jsonl") in files
    assert _plan().bench_task_files(plan.run_names[0]) == []
    with pytest.raises(ConfigError, match=r"^bench\.tasks names unknown task\(s\) \['my_pointr'\]"):
        _plan(f"bench.include_path={user}", "bench.tasks=[my_pointr]")
    with pytest.raises(ConfigError, match=r"^bench\.include_path = '.*nope' is not a directory"):
        _plan(f"bench.include_path={tmp_path / 'nope'}")
    cfg = to_dict(load_config(None, []))
    cfg["runs"] = {"a": {}, "b": {"bench": {"tasks": ["loopline_kop"]}}}
    with pytest.raises(ConfigError, match=r"^runs\.b\.bench\.tasks names unknown task"):
        WorkflowPlan(cfg)


def test_no_downstream_benchmarks_keep_the_bench_rules():
    """bench.tasks: [] without include_path: no error, and the same bench jobs (they write
    reports without tasks)."""
    plan = _plan("bench.tasks=[]", "experiment.results_dir=out")
    run = plan.run_names[0]
    assert plan.bench_task_files(run) == []
    assert plan.bench_results(run) == _plan("experiment.results_dir=out").bench_results(run)
    assert {f"out/{run}/bench/summary.parquet", f"out/{run}/bench/accuracy_vs_heff.png"} <= \
        set(plan.all_targets())


def test_train_signature_ignores_keys_that_leave_the_weights_alone():
    """Activation checkpointing (bit-identical) and extra validation readouts never retrain a
    run; keys added later count only away from their default (a finished run made before
    they existed keeps its signature: checked against 85d7219 by hand, 2026-12-01)."""
    import yaml

    from pipeline_lib.spec.config_load import merge_config_dicts
    from pipeline_lib.workflow.plan import WorkflowPlan

    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "config.yaml")
                          .read_text())

    def signature(**train):
        plan = WorkflowPlan(merge_config_dicts(base, {"train": train}))
        return plan.train_signature("loop4")

    plain = signature()
    assert signature(activation_checkpointing="loop", val_h_eff=[1, 2]) == plain
    two = {"nnodes": 2, "micro_batch_rows": 8}
    assert signature(**two, min_nnodes=1) == signature(**two)  # how few after a node loss
    assert signature(muon_momentum=0.95, freeze=[]) == plain  # the later keys' defaults
    assert signature(freeze=["embeddings"]) != plain
    assert signature(optimizer="muon") != plain


def test_attention_options_at_their_defaults_keep_every_train_signature():
    """head_dim, qkv_bias, qk_norm and norm_placement (added for imported Qwen and OLMo-2
    models) at their defaults leave the signatures of runs made before they existed as they
    were: the model section hashes to what it hashed to before (values computed with the code
    of f6e4e89, which did not have the keys); away from the defaults a run retrains."""
    import yaml

    from pipeline_lib.spec.config_load import merge_config_dicts
    from pipeline_lib.spec.config_model import ModelConfig
    from pipeline_lib.spec.config_write import config_hash
    from pipeline_lib.spec.signatures import model_signature

    assert config_hash(model_signature(ModelConfig())) == "683ddd19999a"
    smollm2_shape = ModelConfig(vocab_size=49152, d_model=576, n_heads=9, n_kv_heads=3)
    assert config_hash(model_signature(smollm2_shape)) == "ef4fafbf50b6"
    base = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "config.yaml")
                          .read_text())

    def signature(**model):
        return WorkflowPlan(merge_config_dicts(base, {"model": model})).train_signature("loop4")

    plain = signature()
    assert signature(head_dim=0, qkv_bias=False, qk_norm="none", norm_placement="pre",
                     init="scaled", learned_positions=0) == plain
    for change in ({"head_dim": 32}, {"qkv_bias": True}, {"qk_norm": "head"},
                   {"norm_placement": "post"}, {"init": "fan_in"}, {"learned_positions": 128}):
        assert signature(**change) != plain, change
