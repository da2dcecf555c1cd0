"""The one-pass H_eff sweep equals separate evaluations; its JSON and CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.heff import parse_h_eff, run_heff, sweep_result


def test_one_pass_sweep_equals_separate_evaluations(tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    sweep = run_heff(snap, data_dir, [1, 2, 4, 8], tmp_path / "all.json",
                     max_tokens=1000, batch_rows=4)
    for h in (1, 2, 4, 8):
        alone = run_heff(snap, data_dir, [h], tmp_path / f"h{h}.json", max_tokens=1000,
                         batch_rows=4)
        assert alone["tokens"] == sweep["tokens"]
        assert alone["losses"][str(h)] == pytest.approx(sweep["losses"][str(h)], rel=1e-6)
    assert sweep["step"] == 7
    assert sweep["tokens"] >= 1000
    assert json.loads((tmp_path / "all.json").read_text()) == sweep
    # An untrained model's losses differ across depth: the sweep really runs the loops.
    assert len({round(v, 6) for v in sweep["losses"].values()}) == 4


def test_sweep_result_flags():
    doc = sweep_result(3, {1: 2.0, 2: 1.5, 4: 1.5, 8: 1.4}, 100)
    assert doc["deeper_better"] is True and doc["best_h_eff"] == 8
    doc = sweep_result(3, {1: 2.0, 2: 1.5, 4: 1.7}, 100)
    assert doc["deeper_better"] is False and doc["best_h_eff"] == 2
    assert doc["perplexities"]["1"] == pytest.approx(7.389056, rel=1e-6)


@pytest.mark.parametrize("bad", ["", "0,1", "a,b"])
def test_bad_h_eff_list(bad: str):
    with pytest.raises(ConfigError, match="--h-eff"):
        parse_h_eff(bad)


def test_parse_h_eff_sorts_and_dedupes():
    assert parse_h_eff("8, 2,2,1") == [1, 2, 8]


def test_cli_writes_json(tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    out = tmp_path / "cli.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "heff", "--snapshot", str(snap), "--data",
         str(data_dir), "--h-eff", "1,3", "--out", str(out), "eval.max_tokens=300",
         "--no-track"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["losses"]) == {"1", "3"} and doc["tokens"] >= 300


def test_cli_tracks_the_sweep_as_a_stage_run_unless_no_track(tiny_run, tmp_path: Path,
                                                              monkeypatch):
    from mlflow import MlflowClient

    from pipeline_lib.cli import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data_dir, snap = tiny_run
    run_dir = tmp_path / "results" / "base"  # the run the snapshot belongs to
    copy = shutil.copytree(snap, run_dir / "snapshots" / snap.name)
    store = tmp_path / "mlflow.db"
    args = ["heff", "--snapshot", str(copy), "--data", str(data_dir), "--h-eff", "1,2",
            "--out", str(tmp_path / "h.json"), "eval.max_tokens=200",
            f"tracking.uri=sqlite:///{store}", "experiment.name=cli-heff"]
    assert main([*args, "--no-track"]) == 0
    assert not store.exists() and not (run_dir / "tracking.json").exists()
    assert main(args) == 0
    client = MlflowClient(f"sqlite:///{store}")
    experiment = client.get_experiment_by_name("cli-heff").experiment_id
    (stage,) = client.search_runs([experiment],
                                  filter_string="tags.`loopline.stage` = 'eval_heff/step_0000007'")
    parent = json.loads((run_dir / "tracking.json").read_text())["parent_run_id"]
    assert stage.data.tags["mlflow.parentRunId"] == parent and stage.info.status == "FINISHED"
    doc = json.loads((tmp_path / "h.json").read_text())
    assert stage.data.metrics["heff/loss_h2"] == doc["losses"]["2"]
    point = doc["adaptive_by_criterion"]["kl"]["points"][-1]  # needed and spent loops
    t = f"t{point['threshold']:g}"
    assert stage.data.metrics[f"heff/adaptive_loops_{t}"] == point["mean_loops"]
    for fill in ("latest", "skip"):
        spent = point["spent"][fill]
        assert stage.data.metrics[f"heff/adaptive_spent_loops_{fill}_{t}"] == spent["mean_loops"]
        assert stage.data.metrics[f"heff/adaptive_spent_loss_{fill}_{t}"] == spent["loss"]


def test_cli_missing_snapshot_is_one_line(tmp_path: Path, tiny_run):
    data_dir, _ = tiny_run
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "heff", "--snapshot", str(tmp_path / "nope"),
         "--data", str(data_dir), "--h-eff", "1", "--out", str(tmp_path / "x.json")],
        capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "error:" in result.stderr


def _scored_documents(data_dir: Path, max_tokens: int, batch_rows: int, key: str) -> dict:
    """{document: scored tokens} read straight from the loader, as the sweep should see it."""
    from pipeline_lib.data.loader import PackedData

    data = PackedData(data_dir)
    counts: dict = {}
    tokens = rows = 0
    for batch in data.val_batches(data.val_rows, batch_rows):
        valid = batch["targets"] != -100
        for r, c in valid.nonzero().tolist():
            doc = (int(batch["doc_index"][r, c]) if key == "doc_index"
                   else (rows + r, int(batch["doc_ids"][r, c])))
            counts[doc] = counts.get(doc, 0) + 1
        tokens += int(valid.sum())
        rows += valid.shape[0]
        if tokens >= max_tokens:
            break
    return counts


def test_sweep_carries_document_statistics(tiny_run, tmp_path: Path):
    from pipeline_lib.data.loader import PackedData

    data_dir, snap = tiny_run
    sweep = run_heff(snap, data_dir, [1, 2, 4], tmp_path / "s.json", max_tokens=1000,
                     batch_rows=4)
    docs = _scored_documents(data_dir, 1000, 4, "doc_index")
    assert sweep["documents"] == len(docs) and sweep["tokens"] == sum(docs.values())
    assert set(sweep["stderr"]) == {"1", "2", "4"} and all(
        0 < se < 1 for se in sweep["stderr"].values())
    assert sweep["paired_baseline"] == 1 and set(sweep["paired"]) == {"2", "4"}
    for h, d in sweep["paired"].items():
        assert d["diff"] == pytest.approx(sweep["losses"][h] - sweep["losses"]["1"], abs=1e-12)
        assert d["lo"] <= d["diff"] <= d["hi"]
    # Levels of the scored documents, from levels.npy: the breakdown adds up to the whole.
    levels = PackedData(data_dir).doc_levels
    by_level = sweep["losses_by_level"]
    expected_tokens: dict[str, int] = {}
    for doc, n in docs.items():
        expected_tokens[str(int(levels[doc]))] = expected_tokens.get(str(int(levels[doc])), 0) + n
    assert {lv: e["tokens"] for lv, e in by_level.items()} == expected_tokens
    for h in ("1", "2", "4"):
        weighted = sum(e["losses"][h] * e["tokens"] for e in by_level.values())
        assert weighted / sweep["tokens"] == pytest.approx(sweep["losses"][h], rel=1e-12)
    assert sum(e["documents"] for e in by_level.values()) == sweep["documents"]


def test_token_losses_equal_the_model_loss(tiny_run):
    """The sweep's own per-token readout averages to the model's (chunked) loss."""
    from pipeline_lib.data.loader import PackedData
    from pipeline_lib.evaluate.heff import sweep_documents
    from pipeline_lib.evaluate.loading import load_for_eval

    data_dir, snap = tiny_run
    model = load_for_eval(snap, with_tokenizer=False).model
    batch = next(PackedData(data_dir).val_batches(4, 4))
    docs = sweep_documents(model, [batch], [1, 3], max_tokens=1)
    with torch.no_grad():
        reference = model.losses(batch, readouts=[1, 3])
    for h, value in docs.means().items():
        assert value == pytest.approx(float(reference[h]), rel=1e-5)


def test_documents_fall_back_to_row_pieces_without_doc_index(tiny_run):
    from pipeline_lib.data.loader import PackedData
    from pipeline_lib.evaluate.heff import sweep_documents
    from pipeline_lib.evaluate.loading import load_for_eval

    data_dir, snap = tiny_run
    model = load_for_eval(snap, with_tokenizer=False).model
    data = PackedData(data_dir)
    batches = [{k: v for k, v in b.items() if k != "doc_index"}
               for b in data.val_batches(data.val_rows, 4)]
    docs = sweep_documents(model, batches, [1, 2], 600, data.doc_levels)
    expected = _scored_documents(data_dir, 600, 4, "doc_ids")
    assert docs.levels is None  # no global document: no level breakdown
    assert sorted(docs.tokens.tolist()) == sorted(expected.values())
    with_index = sweep_documents(model, data.val_batches(data.val_rows, 4), [1, 2], 600)
    for h, value in with_index.means().items():  # the grouping never changes the mean
        assert docs.means()[h] == pytest.approx(value, rel=1e-12)


def test_answer_objective_is_scored_on_answer_tokens_only(tiny_run, tmp_path: Path):
    """A model trained with an answer_* objective is swept on the answer tokens alone."""
    from pipeline_lib.checkpoint.rng import capture_rng_state
    from pipeline_lib.checkpoint.snapshot import write_snapshot
    from pipeline_lib.data.loader import PackedData
    from pipeline_lib.evaluate.loading import load_for_eval
    from pipeline_lib.spec.config_load import load_config
    from pipeline_lib.spec.config_write import save_config

    data_dir, snap = tiny_run
    cfg = load_config(snap / "config.yaml", base=None)
    cfg.train.objective = "answer_deep_supervision"
    save_config(cfg, tmp_path / "config.yaml")
    model = load_for_eval(snap, with_tokenizer=False).model
    answer_snap = write_snapshot(
        tmp_path / "r" / "snapshots" / "step_0000007", model_state=model.state_dict(),
        optimizer_state=torch.optim.AdamW(model.parameters()).state_dict(),
        trainer_state={"step": 7}, rng_state=capture_rng_state(),
        config_yaml=(tmp_path / "config.yaml").read_text(),
        extra_files={"tokenizer.json": (data_dir / "tokenizer.json").read_text()})
    result = run_heff(answer_snap, data_dir, [1, 2], tmp_path / "a.json", max_tokens=10**9,
                      batch_rows=4)
    data = PackedData(data_dir)
    total, weighted = 0, {1: 0.0, 2: 0.0}
    with torch.no_grad():
        for batch in data.val_batches(data.val_rows, 4):
            n = int((batch["answer_mask"] & (batch["targets"] != -100)).sum())
            if n:
                losses = model.losses(batch, readouts=[1, 2], answer_only=True)
                total += n
                for h in (1, 2):
                    weighted[h] += float(losses[h]) * n
    assert result["scored_tokens"] == "answer" and result["tokens"] == total > 0
    for h in (1, 2):
        assert result["losses"][str(h)] == pytest.approx(weighted[h] / total, rel=1e-5)
    assert run_heff(snap, data_dir, [1], tmp_path / "b.json", max_tokens=10**9,
                    batch_rows=4)["scored_tokens"] == "all"
