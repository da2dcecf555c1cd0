"""Validation loss on the fixed slice and greedy samples: exact, deterministic, side-effect free."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import make_pack

from pipeline_lib.data.loader import PackedData
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.train.evaluation import generate_samples, samples_jsonl, validation_losses

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> PackedData:
    return PackedData(make_pack(tmp_path_factory.mktemp("pack") / "data"))


@pytest.fixture
def model(data: PackedData) -> LoopedLM:
    torch.manual_seed(0)
    return LoopedLM(ModelConfig(vocab_size=data.vocab_size, d_model=16, n_heads=2, loops=2))


def test_validation_losses_are_token_weighted_means_from_one_pass(data: PackedData,
                                                                   model: LoopedLM) -> None:
    losses = validation_losses(model, data, 10, 4, readouts=[4, 1, 2], device=CPU)
    assert list(losses) == [1, 2, 4]
    whole = next(data.val_batches(10, 10))
    with torch.no_grad():
        expected = {h: float(v) for h, v in model.losses(whole, [1, 2, 4]).items()}
    assert losses == pytest.approx(expected, rel=1e-6)
    assert len(set(losses.values())) == 3  # three distinct readouts, not one repeated
    assert model.training  # the mode is restored
    # a count read out alone is bit for bit the same as read out beside others
    assert validation_losses(model, data, 10, 4, readouts=[2], device=CPU) == {2: losses[2]}


def test_answer_objective_validates_on_answer_tokens(data: PackedData, model: LoopedLM) -> None:
    """answer_* runs are validated on the tokens they train on (as the H_eff sweep scores them)."""
    loss = validation_losses(model, data, 10, 4, readouts=[2], device=CPU, answer_only=True)[2]
    whole = next(data.val_batches(10, 10))
    with torch.no_grad():
        expected = float(model.losses(whole, [2], answer_only=True)[2])
    assert loss == pytest.approx(expected, rel=1e-6)
    assert loss != pytest.approx(validation_losses(model, data, 10, 4, readouts=[2],
                                                   device=CPU)[2])


def test_greedy_samples_are_deterministic(data: PackedData, model: LoopedLM) -> None:
    rng_before = torch.get_rng_state()
    a = generate_samples(model, data.data_dir, ["a=1;", "x"], 5, step=7, loops=2,
                         context_len=data.seq_len, device=CPU)
    b = generate_samples(model, data.data_dir, ["a=1;", "x"], 5, step=7, loops=2,
                         context_len=data.seq_len, device=CPU)
    assert a == b and [r["prompt"] for r in a] == ["a=1;", "x"]
    assert all(r["step"] == 7 and r["stop"] in ("eos", "length") for r in a)
    assert all(len(r["completion_ids"]) == 5 or r["stop"] == "eos" for r in a)
    assert torch.equal(rng_before, torch.get_rng_state())  # no random draws
    assert samples_jsonl(a).count("\n") == 2
    assert generate_samples(model, data.data_dir, [], 5, step=7, loops=2, context_len=8,
                            device=CPU) == []
