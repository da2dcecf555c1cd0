"""One pass for the whole sweep: the fixed H_eff losses and every criterion's exits equal, bit
for bit, those of a pass of their own (the same function with one criterion at a time,
itself checked against direct computations in test_adaptive.py and test_exit_criteria.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline_lib.evaluate.exit import readout as exit_readout
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.heff import run_heff, sweep_documents
from pipeline_lib.evaluate.sweep_pass import sweep_batch, sweep_pass
from pipeline_lib.spec.config_model import ModelConfig

VOCAB, SEQ = 30, 16
THRESHOLDS = {"kl": (0.0, 1e-3, 0.05, 0.5), "entropy": (0.0, 2.5, 3.2, 3.35),
              "latent_diff": (0.0, 0.05, 0.3), "cosine": (0.0, 1e-3, 0.02, 0.2),
              "argmax_stable": (0, 1, 2), "gate": (1.0, 0.9, 0.6, 0.3)}
ALL = tuple(THRESHOLDS)


def gated_model(coda_layers: int, state_init: str):
    from pipeline_lib.model.looped import LoopedLM

    torch.manual_seed(4)
    model = LoopedLM(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, loops=2, init_std=0.3,
                                 exit_gate=True, coda_layers=coda_layers,
                                 state_init=state_init)).eval()
    with torch.no_grad():
        model.exit_gate.weight.normal_(std=0.5)
    return model


@pytest.fixture(scope="module")
def batches() -> list[dict[str, torch.Tensor]]:
    """Two batches of two documents per row, and a sparse one (few scored targets, as when
    only answers are scored): criteria then read out a handful of rows each."""
    gen = torch.Generator().manual_seed(6)
    out = []
    for sparse in (False, False, True):
        ids = torch.randint(0, VOCAB, (3, SEQ + 1), generator=gen)
        targets = ids[:, 1:].clone()
        targets[:, SEQ // 2 - 1] = -100
        if sparse:
            targets[torch.rand(3, SEQ, generator=gen) < 0.7] = -100
        doc = (torch.arange(SEQ) >= SEQ // 2).long().expand(3, SEQ).clone()
        pos = torch.cat([torch.arange(SEQ // 2)] * 2).expand(3, SEQ).clone()
        out.append({"input_ids": ids[:, :-1], "targets": targets, "doc_ids": doc,
                    "position_ids": pos})
    return out


def specs(h_effs: list[int], max_loops: int, criteria=ALL) -> list[ExitSpec]:
    return [ExitSpec(THRESHOLDS[c], c, max_loops).resolved(h_effs) for c in criteria]


@pytest.mark.parametrize(("coda_layers", "state_init"),
                         [(0, "embedding"), (1, "embedding"), (0, "zeros"), (1, "zeros")])
@pytest.mark.parametrize(("h_effs", "max_loops"),
                         [([1, 2, 4], 6), ([1, 3, 8], 5), ([2, 5], 0), ([1, 2], 1)])
@pytest.mark.parametrize("chunk_rows", [0, 3])  # 0: the default chunks (one per readout)
def test_one_pass_equals_one_pass_per_criterion(batches, monkeypatch, coda_layers, state_init,
                                                h_effs, max_loops, chunk_rows):
    if chunk_rows:
        monkeypatch.setattr(exit_readout, "_CHUNK_ELEMENTS", chunk_rows * VOCAB)
    model = gated_model(coda_layers, state_init)
    every = specs(h_effs, max_loops)
    early = 0
    for batch in batches:
        together = sweep_batch(model, batch, h_effs, every)
        assert torch.equal(together.fixed, sweep_batch(model, batch, h_effs, []).fixed)
        for spec, (losses, exits) in zip(every, together.exits, strict=True):
            alone_losses, alone_exits = sweep_batch(model, batch, [], [spec]).exits[0]
            assert torch.equal(losses, alone_losses), spec.criterion
            assert torch.equal(exits, alone_exits), spec.criterion
            early += int((exits < spec.max_loops).sum())
            if spec.max_loops in h_effs:  # the fixed column is the fixed readout at H
                column = together.fixed[:, sorted(h_effs).index(spec.max_loops)]
                assert torch.equal(losses[:, 0], column)
    assert (early > 0) == (every[0].max_loops > 1)  # tokens exit early wherever they can


def test_criteria_with_their_own_max_loops_and_a_repeated_criterion(batches):
    model = gated_model(1, "embedding")
    every = [ExitSpec(THRESHOLDS["kl"], "kl", 6).resolved([2]),
             ExitSpec(THRESHOLDS["gate"], "gate", 3).resolved([2]),
             ExitSpec((0.0, 0.01), "kl", 4).resolved([2]),  # a second kl memory
             ExitSpec((0, 2), "argmax_stable", 2).resolved([2])]
    for batch in batches:
        together = sweep_batch(model, batch, [2, 4], every)
        for spec, (losses, exits) in zip(every, together.exits, strict=True):
            alone_losses, alone_exits = sweep_batch(model, batch, [], [spec]).exits[0]
            assert torch.equal(losses, alone_losses) and torch.equal(exits, alone_exits)
            assert int(exits.max()) == spec.max_loops


def test_pass_sums_equal_the_sweep_and_each_criterion_alone(batches):
    model = gated_model(0, "embedding")
    every = specs([1, 4], 4)
    swept = sweep_pass(model, batches, [1, 4], every, 60)
    fixed = sweep_documents(model, batches, [1, 4], 60)
    assert swept.fixed.total_tokens == fixed.total_tokens < 3 * 3 * SEQ  # stopped early
    assert (swept.fixed.loss_sums == fixed.loss_sums).all()
    assert (swept.fixed.tokens == fixed.tokens).all()
    for spec, result in zip(every, swept.adaptive, strict=True):
        alone = sweep_pass(model, batches, [], [spec], 60).adaptive[0]
        assert result.spec == spec and result.loops_used == alone.loops_used
        assert (result.documents.loss_sums == alone.documents.loss_sums).all()
        assert (result.documents.tokens == alone.documents.tokens).all()


def test_run_heff_with_every_criterion_writes_what_one_run_per_criterion_writes(
        tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    criteria = ("kl", "entropy", "latent_diff", "cosine", "argmax_stable")
    kwargs = {"max_tokens": 400, "batch_rows": 3, "spent": False}  # the pass alone (replay:
    # test_exit_replay.py, test_exit_results.py)
    together = run_heff(snap, data_dir, [1, 2, 3], tmp_path / "all.json",
                        adaptive=specs([1, 2, 3], 4, criteria), **kwargs)
    fixed = run_heff(snap, data_dir, [1, 2, 3], tmp_path / "fixed.json", **kwargs)
    assert {k: v for k, v in together.items() if not k.startswith("adaptive")} == fixed
    assert list(together["adaptive_by_criterion"]) == list(criteria)
    for c in criteria:
        alone = run_heff(snap, data_dir, [1, 2, 3], tmp_path / f"{c}.json",
                         adaptive=specs([1, 2, 3], 4, [c]), **kwargs)
        assert together["adaptive_by_criterion"][c] == alone["adaptive_by_criterion"][c]
    assert json.loads((tmp_path / "all.json").read_text()) == together
