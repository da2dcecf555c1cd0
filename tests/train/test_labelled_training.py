"""The depth recipe's path end to end on a tiny labelled pack: prefix-parity records with a
label per bit, progressive backprop over sampled loop counts, learned positions and the
fan_in init. Three segments equal one bit for bit; the H_eff sweep reports label accuracy per
level (held-out levels beyond training marked); the HF export reads every held-out record out
with the same per-level accuracy as the library's sweep."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from support.docs_example import worked_example
from trainer_helpers import metrics, snap, tiny_config

from pipeline_lib.data.loader import PackedData
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.evaluate.heff import run_heff
from pipeline_lib.export import export_snapshot
from pipeline_lib.export.modeling_loopline import LooplineForCausalLM
from pipeline_lib.spec.config import DataConfig, SourceConfig
from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.spec.names import IGNORE_INDEX
from pipeline_lib.train.job import train_segment

H_EFFS = [1, 2, 4, 8]
LABELLED = DataConfig(
    sources=[SourceConfig(type="labelled", tasks=["prefix_parity"], num_docs=96,
                          min_difficulty=1, max_difficulty=3, seed=1),
             SourceConfig(type="labelled", tasks=["prefix_parity"], num_docs=12,
                          min_difficulty=2, max_difficulty=2, seed=2, heldout=True),
             SourceConfig(type="labelled", tasks=["prefix_parity"], num_docs=12,
                          min_difficulty=6, max_difficulty=6, seed=3, heldout=True)],
    seq_len=32, epochs=1, val_fraction=0.0, seed=3)
RECIPE = ["model.prelude_layers=0", "model.coda_layers=0", "model.loops=4",
          "model.injection=linear", "model.learned_positions=32", "model.init=fan_in",
          "model.tie_embeddings=false", "train.objective=last",
          "train.loop_sampling.mode=uniform", "train.loop_sampling.max_loops=4",
          "train.bptt.mode=progressive", "train.bptt.k=2", "train.sample_prompts=[]"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(pack, run trained in one segment, run trained in three) over steps 0 → 6."""
    root = tmp_path_factory.mktemp("labelled")
    pack = root / "pack"
    pack_corpus(LABELLED, pack)
    cfg = replace(tiny_config(*RECIPE), data=LABELLED)
    for run, ends in (("one", [6]), ("three", [2, 4, 6])):
        previous = None
        for end in ends:
            previous = train_segment(cfg, pack, previous, end, snap(root / run, end))
    return pack, root / "one", root / "three"


def test_three_segments_equal_one_on_labelled_records(trained) -> None:
    _, one, three = trained
    for name in ("model.safetensors", "optimizer.safetensors"):
        assert (snap(one, 6) / name).read_bytes() == (snap(three, 6) / name).read_bytes()
    m1, m3 = metrics(one), metrics(three)
    assert [m["step"] for m in m1] == [m["step"] for m in m3] == [1, 2, 3, 4, 5, 6]
    for key in ("loss", "loops", "grad_loops"):
        assert [m[key] for m in m1] == [m[key] for m in m3]
    assert all(1 <= m["grad_loops"] <= min(2, m["loops"]) for m in m1)


def _heldout_records(pack: Path) -> list[tuple[int, list[int], list[int]]]:
    """(level, input ids, labels) of every held-out record, from the pack's own arrays."""
    data = PackedData(pack)
    batch = data.val_batch(np.arange(data.val_rows))
    out = []
    for row in range(batch["input_ids"].shape[0]):
        for doc in torch.unique(batch["doc_index"][row]).tolist():
            if doc < 0:
                continue
            at = batch["doc_index"][row] == doc
            out.append((int(data.doc_levels[doc]), batch["input_ids"][row][at].tolist(),
                        batch["targets"][row][at].tolist()))
    return out


def test_sweep_and_export_agree_on_label_accuracy_per_level(trained, tmp_path) -> None:
    pack, one, _ = trained
    result = run_heff(snap(one, 6), pack, H_EFFS, tmp_path / "heff.json", max_tokens=10**6,
                      batch_rows=8)
    labels = result["labels"]
    assert labels["train_levels"] == [1, 2, 3] and labels["train_max_loops"] == 4
    assert set(labels["levels"]) == {"2", "6"}
    assert not labels["levels"]["2"]["beyond_training"]
    assert labels["levels"]["6"]["beyond_training"]
    assert labels["levels"]["6"]["documents"] == 12
    export_snapshot(snap(one, 6), tmp_path / "export")
    hf = LooplineForCausalLM.from_pretrained(tmp_path / "export").eval()
    correct: dict[tuple[int, int], int] = {}
    tokens: dict[int, int] = {}
    for level, ids, targets in _heldout_records(pack):
        scored = torch.tensor(targets) != IGNORE_INDEX
        tokens[level] = tokens.get(level, 0) + int(scored.sum())
        for h in H_EFFS:
            with torch.no_grad():
                logits = hf(torch.tensor([ids]), num_loops=h).logits[0]
            right = (logits.argmax(-1) == torch.tensor(targets))[scored]
            correct[level, h] = correct.get((level, h), 0) + int(right.sum())
    for level in (2, 6):
        section = labels["levels"][str(level)]
        assert section["tokens"] == tokens[level]
        for h in H_EFFS:
            assert section["accuracy"][str(h)] == pytest.approx(correct[level, h] / tokens[level],
                                                                abs=1e-12)
    assert json.loads((tmp_path / "heff.json").read_text()) == result  # written as returned


def test_a_users_labelled_jsonl_trains_and_is_swept_by_level(tmp_path) -> None:
    """docs/data.md's worked example (a train file at levels 1-3, a heldout test file at
    4-5) through the same doors with a config and no code: pack, two steps, the sweep."""
    data, _ = worked_example(tmp_path)
    cfg = tiny_config(*RECIPE, "model.learned_positions=64", "train.total_steps=2")
    cfg = replace(cfg, data=config_from_dict({"data": data}).data)
    pack = tmp_path / "pack"
    pack_corpus(cfg.data, pack)
    out = train_segment(cfg, pack, None, 2, snap(tmp_path / "run", 2))
    labels = run_heff(out, pack, [1, 4], tmp_path / "heff.json", max_tokens=10**6,
                      batch_rows=4)["labels"]
    assert labels["train_levels"] == [1, 2, 3]
    assert {lv: block["beyond_training"] for lv, block in labels["levels"].items()} == \
        {"4": True, "5": True}
    assert labels["all"]["tokens"] == 8 + 9  # the test file's labels (its resets have none)
