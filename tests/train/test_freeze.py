"""train.freeze: which parameters each part names, and that frozen ones never move."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.train.freeze import freeze_parts
from pipeline_lib.train.optim import build_optimizer

CFG = dict(vocab_size=40, d_model=16, n_heads=2, loops=2, injection="linear",
           step_embedding=True, tie_embeddings=False)


def _model(**changes) -> LoopedLM:
    torch.manual_seed(0)
    return LoopedLM(ModelConfig(**{**CFG, **changes}))


def _frozen(model: LoopedLM) -> set[str]:
    return {n for n, p in model.named_parameters() if not p.requires_grad}


@pytest.mark.parametrize(("part", "prefixes"), [
    ("embeddings", ("tok_emb.", "step_emb.")), ("prelude", ("prelude.",)), ("core", ("core.",)),
    ("coda", ("coda.",)), ("head", ("head.",)), ("norm", ("norm.",)),
    ("adapter", ("injection_proj.",))])
def test_each_part_freezes_exactly_its_attributes(part: str, prefixes: tuple[str, ...]):
    model = _model()
    want = {n for n, _ in model.named_parameters() if n.startswith(prefixes)}
    assert freeze_parts(model, [part]) == sum(p.numel() for n, p in model.named_parameters()
                                              if n in want)
    assert want and _frozen(model) == want


def test_adapter_includes_a_learnable_lambda_and_a_tied_head_is_the_embedding():
    model = _model(injection="add", learn_injection_scale=True, tie_embeddings=True)
    freeze_parts(model, ["adapter"])
    assert _frozen(model) == {"injection_scale"}
    freeze_parts(model, ["head", "embeddings"])
    assert _frozen(model) == {"injection_scale", "tok_emb.weight", "step_emb.weight"}


def test_adapter_includes_the_loop_gates_of_gated_recurrence():
    from pipeline_lib.spec.rules import model_parts

    cfg = ModelConfig(**{**CFG, "injection": "add", "recurrence": "gated", "loops": 3})
    assert "adapter" in model_parts(cfg)
    model = _model(injection="add", recurrence="gated", loops=3)
    assert freeze_parts(model, ["adapter"]) == 2 and _frozen(model) == {"loop_gate"}


def _batch(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 40, (2, 13), generator=gen)
    return {"input_ids": tokens[:, :-1], "targets": tokens[:, 1:],
            "position_ids": torch.arange(12).expand(2, 12), "doc_ids": torch.zeros(2, 12, dtype=torch.long)}


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_frozen_parameters_stay_bit_identical_while_the_rest_trains(optimizer: str):
    model = _model(moe_experts=2, moe_top_k=1, moe_bias_update_rate=0.1)
    before = {n: t.detach().clone() for n, t in model.state_dict().items()}
    freeze_parts(model, ["embeddings", "core", "adapter"])
    opt = build_optimizer(model, TrainConfig(optimizer=optimizer, lr=1e-2, weight_decay=0.1))
    in_groups = {id(p) for g in opt.param_groups for p in g["params"]}
    assert all(id(p) not in in_groups for n, p in model.named_parameters() if n in _frozen(model))
    for step in range(3):
        opt.zero_grad(set_to_none=True)
        model(_batch(step), [2]).losses[2].backward()
        opt.step()
        model.update_moe_biases()
    frozen = _frozen(model)
    assert frozen >= {"tok_emb.weight", "step_emb.weight", "injection_proj.weight",
                      "core.0.attn.qkv.weight", "core.0.ffn.w_gate", "core.0.ffn.router.weight"}
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]) == (name in frozen), name
        assert (p.grad is None) == (name in frozen), name
    bias = {n: torch.equal(t, before[n]) for n, t in model.state_dict().items()
            if n.endswith("balance_bias")}  # a frozen block's routing stays as it was
    assert bias == {"prelude.0.ffn.balance_bias": False, "core.0.ffn.balance_bias": True,
                    "coda.0.ffn.balance_bias": False}


def test_the_parts_are_the_configs_vocabulary():
    from pipeline_lib.spec.rules import FREEZE_PARTS
    from pipeline_lib.train.freeze import PART_ATTRIBUTES

    assert tuple(PART_ATTRIBUTES) == FREEZE_PARTS
