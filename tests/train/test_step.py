"""StepRunner: objectives, accumulation, truncated/unrolled backprop, skips."""

from __future__ import annotations

import math

import pytest
import torch
from support.faults import FAULT_ENV, FaultPlan

from pipeline_lib.model.loop_sampling import gradient_loops
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.config_train import BpttConfig, SpikeGuardConfig, TrainConfig
from pipeline_lib.train.optim import build_optimizer
from pipeline_lib.train.spike_guard import SpikeGuard
from pipeline_lib.train.step import StepRunner, unroll_bounds

VOCAB = 40


def _model(**kw) -> LoopedLM:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, loops=3, loss_chunk_size=9, **kw)
    return LoopedLM(cfg)


def _batch(rows: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (rows, 13), generator=gen)
    return {"input_ids": ids[:, :-1], "targets": ids[:, 1:].clone()}


def _runner(model: LoopedLM, faults: str = "", **train_kw) -> StepRunner:
    train = TrainConfig(**{"grad_clip": 0.0, "lr": 1e-2, **train_kw})
    guard = SpikeGuard(SpikeGuardConfig(warmup_steps=0))
    env = {FAULT_ENV: faults} if faults else {}
    return StepRunner(model, build_optimizer(model, train), train, guard,
                      hooks=FaultPlan.from_env(env), device=torch.device("cpu"))


def test_unroll_bounds() -> None:
    assert unroll_bounds(5, "full", 2) == [(0, 5)]
    assert unroll_bounds(5, "truncated", 2) == [(0, 5)]
    assert unroll_bounds(5, "unrolled", 2) == [(0, 2), (2, 4), (4, 5)]
    assert unroll_bounds(2, "unrolled", 4) == [(0, 2)]


def test_objectives_match_the_model_losses() -> None:
    batch = _batch(4, 1)
    with torch.no_grad():
        losses = _model().losses(batch, [1, 2, 3])
    deep = _runner(_model(), objective="deep_supervision").run(1, [batch], 3, flat_row=0)
    last = _runner(_model(), objective="last").run(1, [batch], 3, flat_row=0)
    assert deep.loss == pytest.approx(float(torch.stack(list(losses.values())).mean()), rel=1e-6)
    assert last.loss == pytest.approx(float(losses[3]), rel=1e-6)
    assert deep.optimizer_steps == last.optimizer_steps == 1 and not deep.skipped


def test_answer_objectives_score_answer_tokens_only() -> None:
    batch = _batch(4, 3)
    batch["answer_mask"] = torch.rand(batch["targets"].shape,
                                      generator=torch.Generator().manual_seed(4)) < 0.3
    with torch.no_grad():
        only = _model().losses(batch, [1, 2, 3], answer_only=True)
        every = _model().losses(batch, [1, 2, 3])
    deep = _runner(_model(), objective="answer_deep_supervision").run(1, [batch], 3, flat_row=0)
    last = _runner(_model(), objective="answer_last", answer_weight=7.0).run(1, [batch], 3,
                                                                             flat_row=0)
    assert deep.loss == pytest.approx(float(torch.stack(list(only.values())).mean()), rel=1e-6)
    assert last.loss == pytest.approx(float(only[3]), rel=1e-6)
    assert abs(last.loss - float(every[3])) > 1e-3
    # Targets outside the answers change nothing: the same update either way.
    other = {**batch, "targets": torch.where(batch["answer_mask"], batch["targets"],
                                             (batch["targets"] + 1) % VOCAB)}
    a, b = _model(), _model()
    _runner(a, objective="answer_last").run(1, [batch], 3, flat_row=0)
    _runner(b, objective="answer_last").run(1, [other], 3, flat_row=0)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    c = _model()
    _runner(c, objective="last").run(1, [other], 3, flat_row=0)
    assert not all(torch.equal(x, y) for x, y in zip(a.parameters(), c.parameters(), strict=True))


def test_accumulation_matches_one_big_batch() -> None:
    big = _batch(4, 2)
    halves = [{k: v[:2] for k, v in big.items()}, {k: v[2:] for k, v in big.items()}]
    a, b = _model(), _model()
    ra, rb = _runner(a), _runner(b)
    res_a = ra.run(1, [big], 3, flat_row=0)
    res_b = rb.run(1, halves, 3, flat_row=0)
    assert res_a.loss == pytest.approx(res_b.loss, rel=1e-5)
    assert res_a.grad_norm == pytest.approx(res_b.grad_norm, rel=1e-4)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-4)  # 1% of an lr-1e-2 step


def test_truncated_with_k_at_least_loops_equals_full() -> None:
    batch = _batch(3, 3)
    a, b = _model(), _model()
    _runner(a).run(1, [batch], 3, flat_row=0)
    _runner(b, bptt=BpttConfig(mode="truncated", k=3)).run(1, [batch], 3, flat_row=0)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    c = _model()
    _runner(c, bptt=BpttConfig(mode="truncated", k=1)).run(1, [batch], 3, flat_row=0)
    assert not torch.equal(a.core[0].attn.qkv.weight, c.core[0].attn.qkv.weight)


def test_progressive_backpropagates_through_the_drawn_loops() -> None:
    """Each step's gradient loops are drawn from (seed, step): the step equals truncated
    backprop with that k, and another draw gives other weights."""
    batch = _batch(3, 3)
    bptt = BpttConfig(mode="progressive", k=4)
    drawn = {s: gradient_loops(bptt, 5, 11, s) for s in range(1, 40)}
    step = next(s for s, g in drawn.items() if g == 2)
    other = next(s for s, g in drawn.items() if g == 4)
    a, b, c = _model(), _model(), _model()
    runner = _runner(a, bptt=bptt)
    runner.seed = 11
    result = runner.run(step, [batch], 5, flat_row=0)
    assert result.grad_loops == 2
    _runner(b, bptt=BpttConfig(mode="truncated", k=2)).run(step, [batch], 5, flat_row=0)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    runner_c = _runner(c, bptt=bptt)
    runner_c.seed = 11
    assert runner_c.run(other, [batch], 5, flat_row=0).grad_loops == 4
    assert not torch.equal(a.core[0].attn.qkv.weight, c.core[0].attn.qkv.weight)


def test_segmented_steps_per_segment_and_a_spike_drops_the_rest() -> None:
    batch = _batch(2, 4)
    model = _model(moe_experts=4, moe_top_k=2)
    runner = _runner(model, bptt=BpttConfig(mode="unrolled", k=2))
    result = runner.run(1, [batch], 5, flat_row=0)
    assert result.optimizer_steps == 3 and len(result.unroll_losses) == 3
    # one baseline per unroll, keyed by its loops (3 and 4 are unroll "2:4")
    state = runner.guard.state_dict()
    assert list(state["baselines"]) == ["0:2", "2:4", "4:5"]
    # unroll 2:4 gets a baseline it will exceed: 0:2 is applied, 2:4 spikes, 4:5 dropped
    state["baselines"]["2:4"] = {"ema": 0.01, "prev": 0.01, "count": 5}
    runner.guard.load_state_dict(state)
    result = runner.run(2, [batch], 5, flat_row=0)
    assert result.skipped and result.reason == "loss_spike"
    assert result.optimizer_steps == 1 and len(result.unroll_losses) == 2
    assert all(int(layer.load_counts.sum()) == 0 for _, layer in model.moe_layers())


def test_a_skipped_step_changes_no_weight() -> None:
    model = _model(moe_experts=4, moe_top_k=2)
    runner = _runner(model, faults="nan_step=1")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = runner.run(1, [_batch(2, 5)], 3, flat_row=0, diagnose=True)
    assert result.skipped and result.reason == "non_finite_loss" and math.isnan(result.loss)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert runner.guard.consecutive == 1 and runner.optimizer.state == {}
    result = runner.run(2, [_batch(2, 5)], 3, flat_row=0, diagnose=True)
    assert not result.skipped and runner.guard.consecutive == 0
    assert {"diag/grad_norm/core.0", "diag/act_rms/core.0", "diag/injection_scale"} <= \
        set(result.diagnostics)


@pytest.mark.parametrize("bptt", [BpttConfig(), BpttConfig(mode="truncated", k=2),
                                  BpttConfig(mode="unrolled", k=2)], ids=lambda b: b.mode)
@pytest.mark.parametrize("mode", ["loop", "block"])
def test_activation_checkpointing_trains_bit_identically(bptt: BpttConfig, mode: str) -> None:
    """Two MoE steps of two micro-batches, deep supervision, diagnostics on: the same
    weights, losses, grad norms, MoE biases and load statistics as without checkpointing."""
    batches = [_batch(2, 6), _batch(2, 7)]
    results, models = {}, {}
    for ac in ("none", mode):
        model = _model(moe_experts=4, moe_top_k=2, moe_bias_update_rate=0.05, coda_layers=1)
        runner = _runner(model, bptt=bptt, activation_checkpointing=ac, grad_clip=1.0)
        assert model.activation_checkpointing == ac
        results[ac] = [runner.run(s, batches, 4, flat_row=0, diagnose=True) for s in (1, 2)]
        models[ac] = model
    for a, b in zip(results["none"], results[mode], strict=True):
        assert (a.loss, a.aux_loss, a.grad_norm, a.unroll_losses, a.moe, a.diagnostics) == \
            (b.loss, b.aux_loss, b.grad_norm, b.unroll_losses, b.moe, b.diagnostics)
        assert a.optimizer_steps == b.optimizer_steps > 0 and a.aux_loss > 0
    ref, got = models["none"].state_dict(), models[mode].state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)  # balance_bias included
    assert any(float(layer.balance_bias.abs().sum()) > 0 for _, layer in models[mode].moe_layers())
