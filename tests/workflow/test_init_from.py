"""Acceptance: ``model.init_from`` through the ordinary workflow. A tiny pretrained Llama
(GQA, untied head) is imported once per run (``init/``, tracked as the stage run ``import``),
the first segment warm-starts from it, later segments resume exactly as always; the H_eff
sweep covers the imported snapshot as step 0; ``original`` (every layer, one loop) and
``retro`` (prelude/core/coda, linear adapter, two loops) are one ``runs:`` block; the trained
retrofit exports with logits equal to its snapshot's."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml
from support.hf_import_helpers import save_tiny_llama
from support.workflow_runs import job_counts, snakemake

pytestmark = pytest.mark.slow
RUNS = ("original", "retro")


@pytest.fixture(scope="module")
def retrofit(tmp_path_factory) -> tuple[Path, Path]:
    workdir = tmp_path_factory.mktemp("init_from")
    source = workdir / "pretrained"
    save_tiny_llama(source)
    config = {
        "experiment": {"name": "loopline-init-from"},
        "data": {"sources": [{"type": "stdlib", "max_docs": 12}],
                 "tokenizer": {"type": "file", "path": str(source)}, "seq_len": 32,
                 "curriculum_fraction": 0.0},
        "model": {"init_from": {"source": str(source)}},
        "train": {"total_steps": 4, "steps_per_segment": 2, "global_batch_rows": 4,
                  "micro_batch_rows": 4, "objective": "last", "optimizer": "muon",
                  "eval_interval": 2, "eval_rows": 4, "sample_tokens": 4},
        "snapshots": {"keep_last": 1},
        "eval": {"h_eff": [1, 2], "max_tokens": 512, "adaptive": {"thresholds": []}},
        "bench": {"tasks": ["loopline_khop"], "h_eff": [1], "examples_per_level": 2,
                  "max_difficulty": 2},
        "runs": {"original": {"model": {"loops": 1, "init_from": {"core": [0, 4]}}},
                 "retro": {"model": {"loops": 2, "init_from": {
                     "prelude": [0, 1], "core": [1, 2], "coda": [3, 4], "adapter": "linear"}}}},
    }
    path = workdir / "retrofit.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    result = snakemake(workdir, "--cores", "2", config=path)
    if result.returncode != 0:
        logs = "\n".join(f"== {p}\n{p.read_text()[-3000:]}" for p in (workdir / "logs").rglob("*.log"))
        pytest.fail(f"init_from pipeline failed:\n{result.stderr[-6000:]}\n{logs[-12000:]}")
    return workdir, path


def test_each_run_imports_once_and_warm_starts_its_first_segment(retrofit):
    workdir, _ = retrofit
    for run in RUNS:
        run_dir = workdir / "results" / run
        record = json.loads((run_dir / "init" / "import.json").read_text())
        assert record["architecture"] == "LlamaForCausalLM"
        final = json.loads((run_dir / "snapshots" / "step_0000004" / "trainer_state.json")
                           .read_text())
        assert Path(final["warm_start"]["warm_start_from"]).parts[-2:] == (run, "init")
        assert [s["start_step"] for s in final["segments"]] == [0, 2]  # the second resumed
    retro = json.loads((workdir / "results" / "retro" / "init" / "import.json").read_text())
    assert retro["layers"] == {"prelude": [0, 1], "core": [1, 2], "coda": [3, 4]}
    assert retro["injection"] == "linear"


def test_heff_sweep_covers_the_imported_snapshot_as_step_zero(retrofit):
    workdir, _ = retrofit
    for run in RUNS:
        table = pq.read_table(workdir / "results" / run / "eval" / "heff.parquet").to_pandas()
        assert sorted(set(table["step"])) == [0, 4], run


def test_import_is_a_tracked_stage_run(retrofit):
    from mlflow.tracking import MlflowClient

    workdir, _ = retrofit
    client = MlflowClient(f"sqlite:///{workdir / 'results' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("loopline-init-from")
    runs = client.search_runs([exp.experiment_id], max_results=200)
    imports = [r for r in runs if r.data.tags.get("loopline.stage") == "import"]
    assert sorted(r.data.tags["loopline.run"] for r in imports) == sorted(RUNS)
    for r in imports:
        assert r.data.params["import.architecture"] == "LlamaForCausalLM"
        assert r.data.metrics["import/parameters"] > 0


def test_rerun_does_nothing(retrofit):
    workdir, path = retrofit
    result = snakemake(workdir, "--cores", "1", "--dry-run", config=path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Nothing to be done" in result.stdout + result.stderr or not job_counts(
        result.stdout), result.stdout[-2000:]


def test_trained_retrofit_exports_with_its_snapshots_logits(retrofit):
    from transformers import AutoModelForCausalLM

    from pipeline_lib.evaluate.loading import load_for_eval

    workdir, _ = retrofit
    run_dir = workdir / "results" / "retro"
    model = load_for_eval(run_dir / "snapshots" / "step_0000004").model
    exported = AutoModelForCausalLM.from_pretrained(run_dir / "export", trust_remote_code=True,
                                                    dtype=torch.float32).eval()
    assert exported.config.num_key_value_heads == 2
    ids = torch.tensor([[72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]])
    with torch.no_grad():
        for loops in (1, 2, 3):
            ours = model.logits_at(ids, loops)
            theirs = exported(ids, num_loops=loops).logits
            assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), loops


def test_the_import_command_writes_what_the_rule_wrote(retrofit, tmp_path):
    """One door: ``import-hf`` with the ``retro`` run's layers writes the rule's init/
    snapshot (weights, tokenizer, import record) and, tracked, an ``import`` child run of the
    same shape in its own store."""
    from support.stage_runs import child_runs, cli, run_shape

    workdir, path = retrofit
    cli(tmp_path, "import-hf", "--source", workdir / "pretrained", "--out", "results/retro/init",
        "--prelude", "0:1", "--core", "1:2", "--coda", "3:4", "--adapter", "linear",
        "--loops", "2", "--config", path)
    for name in ("model.safetensors", "tokenizer.json", "import.json"):
        ours = (tmp_path / "results" / "retro" / "init" / name).read_bytes()
        assert ours == (workdir / "results" / "retro" / "init" / name).read_bytes(), name
    ours, theirs = (child_runs(w, "loopline-init-from", "retro")["import"]
                    for w in (tmp_path, workdir))
    assert run_shape(*ours) == run_shape(*theirs)
