"""train.optimizer = muon: which parameters Muon gets, its update against torch.optim.Muon,
the AdamW part against EagerAdamW, and the state through the snapshot's tensor format."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from pipeline_lib.checkpoint.tensorio import (
    join_tree,
    read_safetensors,
    split_tree,
    write_safetensors,
)
from pipeline_lib.errors import ConfigError
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_train import TrainConfig
from pipeline_lib.train.eager import EagerAdamW
from pipeline_lib.train.muon import MuonAdamW
from pipeline_lib.train.optim import build_optimizer, classify_parameters, load_optimizer_state

MUON = TrainConfig(optimizer="muon", lr=1e-2, muon_lr=2e-2, muon_momentum=0.9,
                   muon_adjust_lr="original", weight_decay=0.1, beta1=0.8, beta2=0.9, eps=1e-7)


def _model(**changes) -> LoopedLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, d_model=16, n_heads=2, loops=2, moe_experts=2,
               injection="linear", step_embedding=True, tie_embeddings=False)
    return LoopedLM(ModelConfig(**{**cfg, **changes}))


def _names(model: nn.Module) -> dict[str, list[str]]:
    return {g: [n for n, _ in ps] for g, ps in classify_parameters(model, muon=True).items()}


def test_hidden_matrices_go_to_muon_everything_else_to_adamw():
    groups = _names(_model())
    stacks = ("prelude.0", "core.0", "coda.0")
    assert groups["muon"] == [f"{s}.{w}" for s in stacks for w in (
        "attn.qkv.weight", "attn.out.weight", "ffn.w_gate", "ffn.w_up", "ffn.w_down")]
    assert groups["decay"] == [f"{s}.ffn.router.weight" for s in stacks] + [
        "head.weight", "injection_proj.weight"]
    assert set(groups["no_decay"]) == {"tok_emb.weight", "step_emb.weight", "norm.weight"} | {
        f"{s}.{n}.weight" for s in stacks for n in ("attn_norm", "ffn_norm")}
    dense = _names(_model(moe_experts=0, injection="add", learn_injection_scale=True,
                          tie_embeddings=True))
    assert dense["injection_scale"] == ["injection_scale"] and "decay" not in dense
    assert [n.split(".", 2)[2] for n in dense["muon"][:5]] == [
        "attn.qkv.weight", "attn.out.weight", "ffn.gate.weight", "ffn.up.weight",
        "ffn.down.weight"]
    assert list(classify_parameters(_model())) == ["decay", "no_decay"]  # adamw: no muon group


def test_imported_families_biases_and_qk_norm_gains_stay_with_adamw_without_decay():
    """Qwen2's q/k/v biases and Qwen3/OLMo-2 QK-norm gains are vectors: no Muon, no decay."""
    for qk_norm in ("head", "all_heads"):
        groups = _names(_model(moe_experts=0, qkv_bias=True, qk_norm=qk_norm, head_dim=6))
        extra = {f"core.0.attn.{n}" for n in ("qkv.bias", "q_norm.weight", "k_norm.weight")}
        assert extra <= set(groups["no_decay"])
        assert not extra & set(groups["muon"]) and "core.0.attn.qkv.weight" in groups["muon"]


def _set_grads(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def _through_snapshot_format(state: dict, tmp_path: Path) -> dict:
    """``optimizer.state_dict()`` written and read as the snapshot stores it."""
    doc, tensors = split_tree(state, "optimizer.json")
    write_safetensors(tmp_path / "opt.safetensors", tensors, role="optimizer_tensors")
    (tmp_path / "opt.json").write_text(json.dumps(doc))
    read, _ = read_safetensors(tmp_path / "opt.safetensors")
    return join_tree(json.loads((tmp_path / "opt.json").read_text()), read, "optimizer.json")


def test_muon_step_is_torch_muons_and_the_rest_is_adamws(tmp_path: Path):
    model = _model()
    opt = build_optimizer(model, MUON)
    assert isinstance(opt, MuonAdamW) and [g["name"] for g in opt.param_groups] == [
        "decay", "no_decay", "muon"]
    ref = copy.deepcopy(model)
    named = dict(ref.named_parameters())
    qkv, w_gate = named["core.0.attn.qkv.weight"], named["core.0.ffn.w_gate"]
    experts = [nn.Parameter(m.clone()) for m in w_gate.detach().mT.unbind(0)]  # [H, D] each
    muon_kw = dict(lr=2e-2, weight_decay=0.1, momentum=0.9, adjust_lr_fn="original")
    ref_muon = torch.optim.Muon([qkv], **muon_kw)
    ref_experts = torch.optim.Muon(experts, **muon_kw)
    groups = _names(ref)
    ref_adam = EagerAdamW([{"params": [named[n] for n in groups["decay"]], "weight_decay": 0.1},
                           {"params": [named[n] for n in groups["no_decay"]],
                            "weight_decay": 0.0}], lr=1e-2, betas=(0.8, 0.9), eps=1e-7)
    adam_names = groups["decay"] + groups["no_decay"]
    live = dict(model.named_parameters())
    state: dict = {}
    for step in range(4):
        _set_grads(model, step)
        _set_grads(ref, step)
        for e, m in enumerate(experts):
            m.grad = w_gate.grad[e].mT.clone()
        if step == 2:  # the state goes through the snapshot format into a new optimizer
            opt = build_optimizer(model, MUON)
            saved = _through_snapshot_format(state, tmp_path)
            load_optimizer_state(opt, saved, MUON)
        opt.step()
        ref_muon.step()
        ref_experts.step()
        ref_adam.step()
        state = opt.state_dict()
        assert torch.equal(live["core.0.attn.qkv.weight"], qkv)
        assert all(torch.equal(live["core.0.ffn.w_gate"][e].mT, m) for e, m in enumerate(experts))
        assert all(torch.equal(live[n], named[n]) for n in adam_names)
    buf = opt.state[live["core.0.attn.qkv.weight"]]["momentum_buffer"]
    assert torch.equal(buf, ref_muon.state[qkv]["momentum_buffer"])
    assert set(opt.state[live["core.0.ffn.w_gate"]]) == {"momentum_buffer"}
    assert set(opt.state[live["head.weight"]]) == {"step", "exp_avg", "exp_avg_sq"}
    assert not torch.equal(qkv, _model().core[0].attn.qkv.weight)  # it did move


def test_muon_hparams_follow_the_config_on_resume():
    model = _model()
    opt = build_optimizer(model, MUON)
    _set_grads(model, 0)
    opt.step()
    changed = TrainConfig(**{**vars(MUON), "muon_lr": 0.0, "lr": 5e-3, "muon_momentum": 0.8,
                             "muon_adjust_lr": "match_rms_adamw"})
    new = build_optimizer(model, changed)
    load_optimizer_state(new, copy.deepcopy(opt.state_dict()), changed)
    muon = new.param_groups[-1]
    assert (muon["name"], muon["peak_lr"], muon["momentum"], muon["adjust_lr_fn"]) == (
        "muon", 5e-3, 0.8, "match_rms_adamw")
    assert "betas" not in muon and new.param_groups[0]["betas"] == (0.8, 0.9)


def test_muon_refuses_what_it_cannot_orthogonalize():
    vector = nn.Parameter(torch.zeros(4))
    with pytest.raises(ConfigError, match="2-D matrices or 3-D expert stacks"):
        MuonAdamW([{"params": [vector], "name": "muon"}], adamw=EagerAdamW, lr=1e-3,
                  betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, momentum=0.95,
                  adjust_lr_fn="original")
