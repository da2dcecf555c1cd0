"""Label accuracy from the sweep's one pass equals argmax readouts computed on their own: per
H_eff (``model.logits_at``) and at each token's adaptive exit (``adaptive_logits``), per
level and per document, on hand-built labelled batches (targets = labels of input tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.evaluate.exit.criteria import adaptive_logits
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.heff import run_heff
from pipeline_lib.evaluate.label_accuracy import (
    exit_label_section,
    label_section,
)
from pipeline_lib.evaluate.sweep_pass import sweep_batch, sweep_pass
from pipeline_lib.model.loop_sampling import deepest_loops
from pipeline_lib.spec.config import DataConfig, SourceConfig
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_train import LoopSamplingConfig

VOCAB, SEQ, ROWS, H_EFFS, H = 30, 16, 3, [1, 2, 4], 4
HALF = SEQ // 2
LEVELS = np.array([1, 3, 2, -1] * 3)  # level of global document g (-1: unknown)
TRAIN_LEVELS = [1, 2]
THRESHOLDS = {"kl": (0.0, 1e-3, 0.05, 0.5), "argmax_stable": (0, 1, 2)}


@pytest.fixture(scope="module")
def model():
    from pipeline_lib.model.looped import LoopedLM

    torch.manual_seed(4)
    return LoopedLM(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, loops=2,
                                init_std=0.3)).eval()


@pytest.fixture(scope="module")
def batches(model) -> list[dict[str, torch.Tensor]]:
    """Two batches of rows of two 8-token documents (global doc_index), the last document
    padding; each document's last three tokens carry labels: the model's own top token at
    H_eff 1, 4 or 2 (by document), or a random one, so accuracy moves with depth."""
    gen = torch.Generator().manual_seed(6)
    out = []
    for b in range(2):
        ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=gen)
        doc = (torch.arange(SEQ) >= HALF).long().expand(ROWS, SEQ).clone()
        batch = {"input_ids": ids, "doc_ids": doc,
                 "position_ids": torch.cat([torch.arange(HALF)] * 2).expand(ROWS, SEQ).clone(),
                 "doc_index": (b * ROWS + torch.arange(ROWS))[:, None] * 2 + doc}
        tops = {h: logits.argmax(-1) for h, logits in model.logits_by_loops(batch, H_EFFS).items()}
        targets = torch.full((ROWS, SEQ), -100)
        for r in range(ROWS):
            for d in range(2):
                g = int(batch["doc_index"][r, d * HALF])
                span = slice(d * HALF + HALF - 3, d * HALF + HALF)
                pick = g % 4
                targets[r, span] = (tops[(1, 4, 2)[pick]][r, span] if pick < 3 else
                                    torch.randint(0, VOCAB, (3,), generator=gen))
        if b == 1:  # the last row's second document is padding
            targets[-1, HALF:], batch["doc_index"][-1, HALF:] = -100, -1
        batch["targets"] = targets
        out.append(batch)
    return out


def _direct(model, batches) -> tuple[dict[int, np.ndarray], np.ndarray, np.ndarray]:
    """(h → correct per global document, tokens per document, documents scored) from
    ``model.logits_at`` alone."""
    n_docs = len(LEVELS)
    correct = {h: np.zeros(n_docs, np.int64) for h in H_EFFS}
    tokens = np.zeros(n_docs, np.int64)
    for batch in batches:
        scored = batch["targets"] != -100
        docs = batch["doc_index"][scored].numpy()
        np.add.at(tokens, docs, 1)
        for h in H_EFFS:
            hit = (model.logits_at(batch, h).argmax(-1) == batch["targets"])[scored].numpy()
            np.add.at(correct[h], docs, hit.astype(np.int64))
    return correct, tokens, np.flatnonzero(tokens)


@pytest.fixture(scope="module")
def swept(model, batches):
    specs = [ExitSpec(x, c, H).resolved(H_EFFS) for c, x in THRESHOLDS.items()]
    return sweep_pass(model, batches, H_EFFS, specs, 10**6, LEVELS, labels=True)


def test_accuracy_and_exact_match_equal_the_argmax_of_logits_at(model, batches, swept):
    section = label_section(swept.labels, TRAIN_LEVELS, H)
    correct, tokens, seen = _direct(model, batches)
    assert section["per_document"]["doc_index"] == seen.tolist()  # padding is no document
    assert section["per_document"]["level"] == LEVELS[seen].tolist()
    assert section["per_document"]["tokens"] == tokens[seen].tolist()
    for name, docs in [("all", seen), *((str(lv), seen[LEVELS[seen] == lv]) for lv in (1, 2, 3))]:
        block = section["all"] if name == "all" else section["levels"][name]
        assert (block["documents"], block["tokens"]) == (len(docs), int(tokens[docs].sum()))
        for h in H_EFFS:
            assert block["accuracy"][str(h)] == int(correct[h][docs].sum()) / int(tokens[docs].sum())
            assert block["exact_match"][str(h)] == \
                int((correct[h][docs] == tokens[docs]).sum()) / len(docs)
            for key, point in (("accuracy_ci", "accuracy"), ("exact_match_ci", "exact_match")):
                lo, hi = block[key][str(h)]
                assert 0.0 <= lo <= block[point][str(h)] <= hi <= 1.0, (name, key, h)
    for h in H_EFFS:
        assert section["per_document"]["correct"][str(h)] == correct[h][seen].tolist()
    # the labels were chosen so that depth matters: accuracy is not flat
    assert len({section["all"]["accuracy"][str(h)] for h in H_EFFS}) > 1


def test_levels_beyond_training_best_h_and_drop(swept):
    section = label_section(swept.labels, TRAIN_LEVELS, H)
    assert (section["train_levels"], section["train_max_loops"]) == (TRAIN_LEVELS, H)
    assert {lv: b["beyond_training"] for lv, b in section["levels"].items()} == {
        "1": False, "2": False, "3": True}  # -1 (unknown level) counts in "all" only
    assert section["all"]["tokens"] > sum(b["tokens"] for b in section["levels"].values())
    for block in [section["all"], *section["levels"].values()]:
        acc = {int(h): v for h, v in block["accuracy"].items()}
        best = max(acc.values())
        assert block["best_h_eff"] == min(h for h, v in acc.items() if v == best)
        assert block["best_accuracy"] == best
        assert block["drop_after_best"] == best - acc[max(acc)] >= 0
    # level 1's labels are the top token at H_eff 1: perfect there, worse deeper
    level1 = section["levels"]["1"]
    assert (level1["best_h_eff"], level1["best_accuracy"]) == (1, 1.0)
    assert level1["exact_match"]["1"] == 1.0 and level1["drop_after_best"] > 0
    assert label_section(swept.labels, [], H)["levels"]["3"]["beyond_training"] is False


def test_per_document_counts_sum_to_the_totals(swept):
    section = label_section(swept.labels, TRAIN_LEVELS, H)
    per_doc = section["per_document"]
    assert sum(per_doc["tokens"]) == section["all"]["tokens"]
    for h in H_EFFS:
        assert sum(per_doc["correct"][str(h)]) / sum(per_doc["tokens"]) == \
            section["all"]["accuracy"][str(h)]


@pytest.mark.parametrize("criterion", list(THRESHOLDS))
def test_adaptive_accuracy_at_each_tokens_exit(model, batches, swept, criterion):
    result = next(r for r in swept.adaptive if r.spec.criterion == criterion)
    section = exit_label_section(result.spec.thresholds, result.labels)
    assert list(section) == [str(float(x)) for x in result.spec.thresholds]
    fixed = label_section(swept.labels, TRAIN_LEVELS, H)
    for x in result.spec.thresholds:
        hits, loops, levels = [], [], []
        for batch in batches:
            logits, exits = adaptive_logits(model, batch, ExitSpec((x,), criterion, H))
            scored = batch["targets"] != -100
            hits.append((logits.argmax(-1) == batch["targets"])[scored].numpy())
            loops.append(exits[scored].numpy())
            levels.append(LEVELS[batch["doc_index"][scored].numpy()])
        hits, loops, levels = map(np.concatenate, (hits, loops, levels))
        point = section[str(float(x))]
        for name, mask in [("all", levels == levels), *((str(lv), levels == lv) for lv in (1, 2, 3))]:
            block = point["all"] if name == "all" else point["levels"][name]
            assert block["tokens"] == int(mask.sum())
            assert block["accuracy"] == int(hits[mask].sum()) / int(mask.sum()), (x, name)
            assert block["mean_loops"] == int(loops[mask].sum()) / int(mask.sum())
            assert 1 <= block["mean_loops"] <= H
            lo, hi = block["accuracy_ci"]
            assert 0.0 <= lo <= block["accuracy"] <= hi <= 1.0
    never = section[str(float(result.spec.thresholds[0]))]  # 0: no token exits early
    assert never["all"]["accuracy"] == fixed["all"]["accuracy"][str(H)]
    assert never["all"]["mean_loops"] == H
    assert any(section[k]["all"]["mean_loops"] < H for k in section)  # others exit early


def test_labels_change_no_loss_and_no_exit(model, batches):
    specs = [ExitSpec(x, c, H).resolved(H_EFFS) for c, x in THRESHOLDS.items()]
    for batch in batches:
        plain, labelled = (sweep_batch(model, batch, H_EFFS, specs, labels) for labels in
                           (False, True))
        assert torch.equal(plain.fixed, labelled.fixed)
        for (losses, exits), (same_losses, same_exits) in zip(plain.exits, labelled.exits,
                                                               strict=True):
            assert torch.equal(losses, same_losses) and torch.equal(exits, same_exits)
        assert plain.hits is None and plain.exit_hits == []


def test_unlabelled_sweep_keeps_no_hits(model, batches):
    plain = sweep_pass(model, batches, H_EFFS, [ExitSpec((0.0, 0.05), "kl", H).resolved(H_EFFS)],
                       10**6, LEVELS)
    assert plain.labels is None and plain.adaptive[0].labels is None


@pytest.mark.parametrize(("sampling", "want"), [
    (LoopSamplingConfig(), 2), (LoopSamplingConfig(mode="uniform", max_loops=16), 16),
    (LoopSamplingConfig(mode="poisson_lognormal", max_loops=12), 12)])
def test_deepest_loops_is_the_deepest_training_loop_count(sampling, want):
    assert deepest_loops(sampling, 2) == want


LABELLED = DataConfig(
    sources=[SourceConfig(type="labelled", tasks=["prefix_parity"], num_docs=8,
                          min_difficulty=1, max_difficulty=2),
             SourceConfig(type="labelled", tasks=["prefix_parity"], num_docs=12,
                          min_difficulty=1, max_difficulty=4, seed=1, heldout=True)],
    seq_len=64, epochs=1, val_fraction=0.0)


def test_run_heff_writes_the_labels_sections_only_for_a_labelled_pack(tiny_run, tmp_path):
    """The snapshot swept over its own (reasoning) pack has no labels section; over a
    labelled pack of the same byte vocabulary, the labels section and each adaptive
    section's, levels beyond the pack's training levels marked."""
    data_dir, snap = tiny_run
    kwargs = {"max_tokens": 10**6, "batch_rows": 4, "spent": False,
              "adaptive": ExitSpec((0.0, 0.05), "kl", 4)}
    plain = run_heff(snap, data_dir, [1, 2, 4], tmp_path / "plain.json", **kwargs)
    assert "labels" not in plain and "labels" not in plain["adaptive_by_criterion"]["kl"]
    pack_corpus(LABELLED, tmp_path / "labelled")
    result = run_heff(snap, tmp_path / "labelled", [1, 2, 4], tmp_path / "labelled.json",
                      **kwargs)
    assert json.loads((tmp_path / "labelled.json").read_text()) == result
    labels = result["labels"]
    assert (labels["train_levels"], labels["train_max_loops"]) == ([1, 2], 2)  # model.loops
    assert labels["all"]["tokens"] == result["tokens"]
    assert labels["all"]["documents"] == result["documents"] == 12
    assert set(labels["levels"]) == set(result["losses_by_level"])
    assert all(block["beyond_training"] == (int(lv) > 2) for lv, block in labels["levels"].items())
    assert any(block["beyond_training"] for block in labels["levels"].values())
    kl = result["adaptive_by_criterion"]["kl"]
    assert list(kl["labels"]) == ["0.0", "0.05"]
    assert kl["labels"]["0.0"]["all"]["accuracy"] == labels["all"]["accuracy"]["4"]
    assert kl["labels"]["0.0"]["all"]["mean_loops"] == 4
