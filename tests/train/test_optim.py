"""Parameter groups, AdamW/AdamATan2 construction, AdamATan2 against a float64 reference."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from pipeline_lib.errors import CheckpointError
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.train.optim import (
    AdamATan2,
    build_optimizer,
    classify_parameters,
    load_optimizer_state,
    param_groups,
)


class MyRMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class Toy(nn.Module):
    def __init__(self, learn_lambda: bool = True):
        super().__init__()
        self.tok_emb = nn.Embedding(10, 4)
        self.step_embedding = nn.Parameter(torch.zeros(3, 4))
        self.proj = nn.Linear(4, 4)
        self.norm = MyRMSNorm(4)
        self.ln = nn.LayerNorm(4)
        self.experts = nn.Parameter(torch.zeros(2, 4, 4))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.tok_emb.weight  # tied
        self.frozen = nn.Parameter(torch.zeros(4, 4), requires_grad=False)
        if learn_lambda:
            self.injection_scale = nn.Parameter(torch.tensor(1.0))


def _names(groups):
    return {g: [n for n, _ in ps] for g, ps in groups.items()}


def test_classification_rules():
    assert _names(classify_parameters(Toy())) == {
        "decay": ["experts", "proj.weight"],  # named_parameters order: own, then children
        "no_decay": ["step_embedding", "tok_emb.weight", "proj.bias", "norm.weight",
                     "ln.weight", "ln.bias"],
        "injection_scale": ["injection_scale"],
    }
    assert "injection_scale" not in classify_parameters(Toy(learn_lambda=False))


def test_groups_carry_peak_lr_and_decay():
    train = TrainConfig(lr=1e-3, injection_lr=5e-2, weight_decay=0.1, lr_scaling="linear",
                        reference_batch_rows=8, global_batch_rows=16)
    groups = {g["name"]: g for g in param_groups(Toy(), train)}
    assert groups["decay"]["peak_lr"] == 2e-3 and groups["decay"]["weight_decay"] == 0.1
    assert groups["no_decay"]["peak_lr"] == 2e-3 and groups["no_decay"]["weight_decay"] == 0.0
    assert groups["injection_scale"]["peak_lr"] == 0.1
    assert groups["injection_scale"]["weight_decay"] == 0.0
    same = {g["name"]: g for g in param_groups(Toy(), dataclasses.replace(train, injection_lr=0))}
    assert same["injection_scale"]["peak_lr"] == same["decay"]["peak_lr"]


def test_build_optimizer_kinds():
    model = Toy()
    adamw = build_optimizer(model, TrainConfig(beta1=0.8, beta2=0.9, eps=1e-7))
    assert isinstance(adamw, torch.optim.AdamW)
    assert [g["name"] for g in adamw.param_groups] == ["decay", "no_decay", "injection_scale"]
    assert adamw.param_groups[0]["betas"] == (0.8, 0.9) and adamw.param_groups[0]["eps"] == 1e-7
    assert adamw.param_groups[1]["weight_decay"] == 0.0
    atan = build_optimizer(model, TrainConfig(optimizer="adamatan2"))
    assert isinstance(atan, AdamATan2) and atan.param_groups[0]["weight_decay"] == 0.1


def test_matches_the_models_own_roles():
    from pipeline_lib.model.looped import LoopedLM

    cfg = ModelConfig(vocab_size=50, d_model=16, n_heads=2, loops=2, moe_experts=2,
                      learn_injection_scale=True, step_embedding=True, tie_embeddings=False)
    model = LoopedLM(cfg)
    ours = {g: {id(p) for _, p in ps} for g, ps in classify_parameters(model).items()}
    # the model's roles: λ alone, embeddings and 1-D tensors (norms, biases) undecayed
    theirs: dict[str, set[int]] = {"decay": set(), "no_decay": set(), "injection_scale": set()}
    for name, p in model.named_parameters():
        role = ("injection_scale" if name == "injection_scale" else "no_decay"
                if p.dim() < 2 or name.startswith(("tok_emb.", "step_emb.")) else "decay")
        theirs[role].add(id(p))
    assert ours == theirs and len(theirs["injection_scale"]) == 1


def _reference_adam_atan2(p, grads, lr, betas, wd, a=1.27, b=1.0):
    p, m, v = p.astype(np.float64), np.zeros_like(p, np.float64), np.zeros_like(p, np.float64)
    for t, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        p = p * (1 - lr * wd)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        p = p - lr * a * np.arctan2(m_hat, b * np.sqrt(v_hat))
    return p


def _run_atan2(p0, grads, **kw):
    p = nn.Parameter(torch.tensor(p0))
    opt = AdamATan2([p], **kw)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy(), opt


def test_adam_atan2_matches_float64_reference():
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(5, 7)).astype(np.float32)
    grads = [rng.normal(size=(5, 7)).astype(np.float32) * s for s in (1.0, 0.1, 3.0, 1e-4, 0.5)]
    got, opt = _run_atan2(p0, grads, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    want = _reference_adam_atan2(p0, grads, 1e-2, (0.9, 0.95), 0.1)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    state = opt.state[opt.param_groups[0]["params"][0]]
    assert state["step"].item() == 5.0 and state["step"].device.type == "cpu"


def test_adam_atan2_is_scale_invariant_bounded_and_eps_free():
    rng = np.random.default_rng(1)
    p0 = rng.normal(size=(64,)).astype(np.float32)
    grads = [rng.normal(size=(64,)).astype(np.float32) for _ in range(3)]
    small, _ = _run_atan2(p0, grads, lr=1e-2)
    big, _ = _run_atan2(p0, [g * 1e6 for g in grads], lr=1e-2)
    np.testing.assert_allclose(small, big, rtol=0, atol=1e-6)
    one, _ = _run_atan2(p0, [grads[0] * 1e12], lr=1e-2)
    assert np.abs(one - p0).max() <= 1e-2 * 1.27 * math.pi / 2 + 1e-6
    zero, _ = _run_atan2(p0, [np.zeros(64, np.float32)] * 2, lr=1e-2)
    assert np.array_equal(zero, p0)  # atan2(0, 0) = 0: no NaN, no move


def test_adam_atan2_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    opt = AdamATan2(model.parameters(), lr=1e-2, weight_decay=0.05)
    x = torch.randn(16, 6)

    def step(m, o):
        o.zero_grad()
        m(x).pow(2).mean().backward()
        o.step()

    for _ in range(3):
        step(model, opt)
    clone = nn.Linear(6, 3)
    clone.load_state_dict(model.state_dict())
    opt2 = AdamATan2(clone.parameters(), lr=1.0)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # load_state_dict aliases tensors
    for _ in range(3):
        step(model, opt)
        step(clone, opt2)
    for a, b in zip(model.parameters(), clone.parameters(), strict=True):
        assert torch.equal(a, b)


def test_load_optimizer_state_refreshes_hparams_and_rejects_misfits():
    model = Toy()
    old = build_optimizer(model, TrainConfig(lr=1e-3, weight_decay=0.1))
    for p in model.parameters():
        p.grad = torch.ones_like(p) if p.requires_grad else None
    old.step()
    new_train = TrainConfig(lr=5e-4, weight_decay=0.01)
    opt = build_optimizer(model, new_train)
    load_optimizer_state(opt, old.state_dict(), new_train)
    assert opt.param_groups[0]["peak_lr"] == 5e-4 and opt.param_groups[0]["weight_decay"] == 0.01
    first = opt.param_groups[0]["params"][0]
    assert torch.equal(opt.state[first]["exp_avg"], old.state[first]["exp_avg"])
    other = build_optimizer(Toy(learn_lambda=False), new_train)
    with pytest.raises(CheckpointError, match="parameter groups"):
        load_optimizer_state(other, old.state_dict(), new_train, source="snap")
