"""MoE FFN: dropless routing, grouped vs looped experts (probe, per-shape fallback), aux loss,
bias balancing."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.model import moe
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.model.moe import MoEFFN, grouped_mm_works


def _layer(E: int = 4, k: int = 2, dim: int = 16, hidden: int = 24, rate: float = 0.0,
           aux: float = 0.01, seed: int = 0) -> MoEFFN:
    torch.manual_seed(seed)
    layer = MoEFFN(dim, hidden, E, k, aux_loss_weight=aux, bias_update_rate=rate)
    layer.reset_parameters(0.3, 0.3)
    return layer


def test_output_equals_per_token_sum_over_chosen_experts():
    layer = _layer(E=5, k=2)
    x = torch.randn(2, 7, 16)
    layer.balance_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1, -0.4]))
    y = layer(x)
    flat = x.reshape(-1, 16)
    probs = F.softmax(flat @ layer.router.weight.T, dim=-1)
    ref = torch.zeros_like(flat)
    for i, tok in enumerate(flat):
        chosen = torch.topk(probs[i] + layer.balance_bias, 2).indices  # bias: selection only
        gates = probs[i, chosen] / probs[i, chosen].sum()
        for g, e in zip(gates, chosen.tolist(), strict=True):
            hidden = F.silu(tok @ layer.w_gate[e]) * (tok @ layer.w_up[e])
            ref[i] += g * (hidden @ layer.w_down[e])
    torch.testing.assert_close(y.reshape(-1, 16), ref, atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(not grouped_mm_works(torch.device("cpu"), torch.float32),
                    reason="torch._grouped_mm unusable on this CPU build")
@pytest.mark.parametrize("E, k", [(4, 2), (6, 1), (3, 3)])
def test_grouped_and_looped_experts_are_identical(E, k):
    layer = _layer(E=E, k=k)
    x = torch.randn(3, 11, 16)
    results = {}
    for impl in ("grouped", "loop"):
        layer.expert_impl = impl
        layer.zero_grad()
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        results[impl] = (y.detach(), xi.grad, layer.w_gate.grad.clone(),
                         layer.w_down.grad.clone(), layer.router.weight.grad.clone())
    for a, b in zip(results["grouped"], results["loop"], strict=True):
        assert torch.equal(a, b)


def test_experts_with_no_tokens_are_fine():
    layer = _layer(E=4, k=1)
    layer.balance_bias.copy_(torch.tensor([5.0, 0.0, 0.0, 0.0]))  # everything to expert 0
    for impl in ("grouped", "loop"):
        layer.expert_impl = impl
        y = layer(torch.randn(1, 5, 16))
        assert torch.isfinite(y).all()
    assert layer.load_counts.tolist() == [10, 0, 0, 0]


def test_aux_loss_is_switch_loss():
    layer = _layer(E=4, k=2)
    x = torch.randn(2, 6, 16)
    layer.train()
    layer(x)
    (term,) = layer.take_aux_terms()
    top_idx, _, probs = layer.route(x.reshape(-1, 16))
    frac = torch.bincount(top_idx.reshape(-1), minlength=4).float() / top_idx.numel()
    torch.testing.assert_close(term, 4 * (frac * probs.mean(0)).sum())
    assert term.requires_grad
    layer.eval()
    layer(x)
    assert layer.take_aux_terms() == []  # eval: no terms, no load counting
    assert int(layer.load_counts.sum()) == 2 * 6 * 2


def test_bias_update_rule_and_buffers():
    layer = _layer(E=4, k=1, rate=0.1)
    layer.load_counts.copy_(torch.tensor([6, 2, 2, 0]))
    layer.update_bias()
    torch.testing.assert_close(layer.balance_bias, 0.1 * (0.25 - torch.tensor([0.6, 0.2, 0.2, 0.0])))
    assert layer.load_counts.sum() == 0
    torch.testing.assert_close(layer.current_load(), torch.tensor([0.6, 0.2, 0.2, 0.0]))
    state = layer.state_dict()
    assert "balance_bias" in state and "load_counts" not in state


def test_bias_balancing_evens_out_a_skewed_router():
    E = 8
    layer = _layer(E=E, k=2, rate=0.05, aux=0.0)
    u = torch.nn.functional.normalize(torch.randn(16), dim=0)
    with torch.no_grad():  # strong preference for experts 0 and 1 along a shared direction
        layer.router.weight[0] += 3.0 * u
        layer.router.weight[1] += 2.0 * u
    gen = torch.Generator().manual_seed(1)

    def batch() -> torch.Tensor:
        return torch.randn(4, 32, 16, generator=gen) + 2.0 * u

    def max_load() -> float:
        layer.load_counts.zero_()
        with torch.no_grad():
            layer(batch())
        return float(layer.current_load().max())

    layer.train()
    assert max_load() > 0.4  # skewed: balanced would be 1/8
    for _ in range(150):
        layer.load_counts.zero_()
        with torch.no_grad():
            layer(batch())
        layer.update_bias()
    assert max_load() <= 2 / E


def test_model_level_balancing_api(make_config, make_batch):
    torch.manual_seed(0)
    model = LoopedLM(make_config(moe_experts=4, moe_top_k=2, moe_bias_update_rate=0.01))
    batch = make_batch([[6, 10], [16]])
    model.train()
    losses = model.losses(batch, [1, 2])
    aux = model.take_aux_loss()
    # prelude once, core at loops 1 and 2, coda once per readout: 5 recorded calls.
    assert aux.requires_grad and aux.item() > 0
    assert model.take_aux_loss().item() == 0.0  # taken
    (sum(losses.values()) + aux).backward()
    assert model.core[0].ffn.router.weight.grad is not None
    counts = {name: layer.load_counts.clone() for name, layer in model.moe_layers()}
    assert int(counts["core.0"].sum()) == 2 * 32 * 2  # two loops × 32 tokens × top-2
    stats = model.moe_load_stats()
    assert set(stats) == {f"moe_load/{n}/{s}" for n in ("prelude.0", "core.0", "coda.0")
                          for s in ("e0", "e1", "e2", "e3", "max")}
    before = model.core[0].ffn.balance_bias.clone()
    model.update_moe_biases()
    load = counts["core.0"].double() / counts["core.0"].sum()
    torch.testing.assert_close(model.core[0].ffn.balance_bias,
                               before + (0.01 * (0.25 - load)).float())
    assert all(int(layer.load_counts.sum()) == 0 for _, layer in model.moe_layers())
    model.losses(batch, [1])
    model.clear_moe_loads()
    assert all(int(layer.load_counts.sum()) == 0 for _, layer in model.moe_layers())
    assert "core.0.ffn.balance_bias" in model.state_dict()


@pytest.fixture
def fresh_choices():
    moe.reset_grouped_mm_choices()
    yield
    moe.reset_grouped_mm_choices()


def test_the_probe_runs_without_gradients_and_keys_by_backward(fresh_choices):
    cpu = torch.device("cpu")
    with torch.inference_mode():  # an evaluation process: forward only, no backward call
        assert grouped_mm_works(cpu, torch.float32)
    with torch.no_grad():
        assert grouped_mm_works(cpu, torch.bfloat16)
    assert set(moe._probed) == {("cpu", None, torch.float32, False),
                                ("cpu", None, torch.bfloat16, False)}
    assert grouped_mm_works(cpu, torch.float32)  # training asks again, backward included
    assert moe._probed[("cpu", None, torch.float32, True)] is True


def test_an_unaligned_expert_shape_falls_back_to_the_loop_once(fresh_choices, caplog):
    odd = _layer(hidden=58)  # 58 fp32 = 232 bytes a row
    even = _layer(hidden=60)
    x = torch.randn(2, 9, 16)
    odd.expert_impl = "grouped"  # the kernel itself refuses the shape, on the CPU too
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        odd(x)
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.model.moe"):
        outs = {}
        for impl in ("auto", "loop"):
            odd.expert_impl = impl
            outs[impl] = [odd(x) for _ in range(3)]
        even(x)
    for a, b in zip(outs["auto"], outs["loop"], strict=True):
        assert torch.equal(a, b)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["MoE experts 16→58 in float32 on cpu: rows are not multiples of 16 "
                        "bytes; this shape uses the per-expert loop"]
    assert moe.expert_paths() == {"16x58 float32 cpu": "loop", "16x60 float32 cpu": "grouped"}
    assert moe.moe_tags() == {"loopline.moe_grouped_mm_fallback":
                              "16x58 float32 cpu: rows are not multiples of 16 bytes"}
