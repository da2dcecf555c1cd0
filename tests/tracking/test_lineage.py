"""The pack as an mlflow.data dataset input, the final snapshot as a logged model: each once,
online and through the outbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tracking_helpers import client, free_port, make_config

from pipeline_lib.spec.config import Config
from pipeline_lib.tracking import init_parent_run, start_stage, sync_outbox
from pipeline_lib.tracking.lineage import pack_dataset, pack_digest

META = {"data_id": "0123456789ab", "total_tokens": 5000, "num_docs": 40, "num_train_docs": 38,
        "num_val_docs": 2, "seq_len": 64, "token_dtype": "uint16", "layout": "document_causal_lm",
        "arrays": {"tokens.bin": "aa", "docs.npy": "bb"}, "tokenizer_sha256": "cc",
        "sources": [{"type": "reasoning", "path": "", "fingerprint": "f00d", "num_docs": 40,
                     "num_tokens": 5000, "index": 0}]}


def _export(tmp_path: Path) -> list[Path]:
    out = tmp_path / "results" / "base" / "export"
    out.mkdir(parents=True)
    (out / "config.json").write_text('{"model_type": "loopline"}')
    (out / "tokenizer.json").write_text("{}")
    return [out / "config.json", out / "tokenizer.json"]


SPEC = {"name": "base-step30", "key": "base/step_0000030/abc/model", "step": 30,
        "params": {"num_loops": 4, "hidden_size": 32}, "tags": {"loopline.run": "base"},
        "metrics": {"model/val_loss": 1.75}, "dataset": {"name": "0123456789ab", "digest": "d1"}}


def test_pack_dataset_fields(tmp_path: Path) -> None:
    dataset = pack_dataset(META, tmp_path / "data" / "0123456789ab")
    assert dataset["name"] == "0123456789ab" and dataset["digest"] == pack_digest(META)
    assert len(dataset["digest"]) == 16 and dataset["source_type"] == "local"
    source = json.loads(dataset["source"])
    assert source["uri"] == (tmp_path / "data" / "0123456789ab").as_uri()
    assert source["sources"] == [{"type": "reasoning", "path": "", "fingerprint": "f00d",
                                  "num_docs": 40, "num_tokens": 5000}]
    profile = json.loads(dataset["profile"])
    assert (profile["num_tokens"], profile["num_documents"], profile["seq_len"]) == (5000, 40, 64)
    features = json.loads(json.loads(dataset["schema"])["mlflow_tensorspec"]["features"])
    assert [(f["name"], f["tensor-spec"]["dtype"]) for f in features] == [
        ("tokens", "uint16"), ("docs", "int64")]
    assert pack_digest({**META, "arrays": {"tokens.bin": "ab", "docs.npy": "bb"}}) != dataset["digest"]


def _inputs(uri: str, run_id: str) -> list[tuple[str, str, str]]:
    run = client(uri).get_run(run_id)
    return [(d.dataset.name, d.dataset.digest, d.tags[0].value)
            for d in run.inputs.dataset_inputs]


def test_dataset_input_of_a_run_and_its_parent_once(cfg: Config, run_dir: Path,
                                                    store_uri: str, tmp_path: Path) -> None:
    parent = init_parent_run(cfg, "base", run_dir, "0123456789ab")["parent_run_id"]
    for _ in range(2):  # a retried stage
        with start_stage(cfg, run_dir, "pack") as stage:
            stage.log_dataset(META, tmp_path / "data", parent=True)
    expected = [("0123456789ab", pack_digest(META), "train")]
    assert _inputs(store_uri, stage.run_id) == expected
    assert _inputs(store_uri, parent) == expected


def _model_ids(uri: str, experiment: str) -> list:
    exp = client(uri).get_experiment_by_name(experiment).experiment_id
    return list(client(uri).search_logged_models([exp]))


def test_logged_model_of_the_train_run_once(cfg: Config, run_dir: Path, store_uri: str,
                                            tmp_path: Path) -> None:
    files = _export(tmp_path)
    with start_stage(cfg, run_dir, "train") as train:
        train.log_metrics(30, {"train/loss": 2.0})
    for _ in range(2):  # a rerun of the export stage
        with start_stage(cfg, run_dir, "export") as stage:
            model_id = stage.log_model(train.run_id, SPEC, files)
    models = _model_ids(store_uri, cfg.experiment.name)
    assert [m.model_id for m in models] == [model_id]
    model = client(store_uri).get_logged_model(model_id)
    assert (model.name, str(model.status), model.source_run_id) == (
        "base-step30", "READY", train.run_id)
    assert model.params == {"num_loops": "4", "hidden_size": "32"}
    assert model.tags["loopline.key"] == SPEC["key"]
    assert [(m.key, m.value, m.step, m.dataset_name) for m in model.metrics] == [
        ("model/val_loss", 1.75, 30, "0123456789ab")]
    artifacts = sorted(a.path for a in client(store_uri).list_logged_model_artifacts(model_id))
    assert artifacts == ["config.json", "tokenizer.json"]
    outputs = client(store_uri).get_run(train.run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(model_id, 30)]


def test_offline_dataset_and_model_are_replayed_once(cfg: Config, run_dir: Path, store_uri: str,
                                                     tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    dead = make_config(f"http://127.0.0.1:{free_port()}", request.node.name)
    files = _export(tmp_path)
    with start_stage(dead, run_dir, "train") as train:
        train.log_dataset(META, tmp_path / "data")
    with start_stage(dead, run_dir, "export") as stage:
        assert stage.log_model(train.run_id, SPEC, files) is None  # offline: in the outbox
    assert sync_outbox(run_dir, store_uri).skipped == 0
    assert sync_outbox(run_dir, store_uri).records == 0
    [model] = _model_ids(store_uri, cfg.experiment.name)
    assert str(model.status) == "READY"
    assert _inputs(store_uri, model.source_run_id) == [("0123456789ab", pack_digest(META),
                                                        "train")]
    artifacts = sorted(a.path for a in client(store_uri).list_logged_model_artifacts(
        model.model_id))
    assert artifacts == ["config.json", "tokenizer.json"]


def test_variants_logging_one_pack_at_once_do_not_collide(store_uri: str) -> None:
    """Parallel track_init jobs of variants sharing a pack: MLflow's look-up-then-insert of a
    dataset races on its unique key (seen in `make demo`); the loser looks it up again."""
    import threading

    from pipeline_lib.tracking.lineage import log_dataset

    store = client(store_uri)
    experiment = store.create_experiment("race")
    runs = [store.create_run(experiment).info.run_id for _ in range(4)]
    errors: list[Exception] = []

    def log(run_id: str, digest: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            log_dataset(store, run_id, {**pack_dataset(META, Path("d")), "digest": digest})
        except Exception as exc:  # noqa: BLE001 (collected for the assertion)
            errors.append(exc)

    for round_ in range(5):
        barrier = threading.Barrier(len(runs))
        threads = [threading.Thread(target=log, args=(r, f"digest{round_}", barrier)) for r in runs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    for run_id in runs:
        assert sorted(d.dataset.digest for d in store.get_run(run_id).inputs.dataset_inputs) == [
            f"digest{i}" for i in range(5)]
