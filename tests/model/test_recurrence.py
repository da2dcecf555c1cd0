"""Gated recurrence (loops after the first start as exact no-ops, then learn) and the noise
initial state (truncated normal in training, its mean outside)."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.errors import ConfigError
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.model.recurrence import NOISE_TRUNCATION


def _model(make_config, seed: int = 0, **overrides) -> LoopedLM:
    torch.manual_seed(seed)
    return LoopedLM(make_config(**overrides))


def _reference_states(model: LoopedLM, ids: torch.Tensor, loops: int) -> list[torch.Tensor]:
    """The gated recurrence written out from its definition: s_1 = core(s_0 + λe),
    s_t = s_{t−1} + g_t·(core(x_t) − x_t) with x_t = s_{t−1} + λe (g past the table: last)."""
    ctx = model.embed(ids)
    s, states = torch.zeros_like(ctx.e), []
    for t in range(loops):
        x = s + model.injection_scale * ctx.e
        out = x
        for block in model.core:
            out = block(out, ctx.rope, ctx.mask)
        g = model.loop_gate[min(t, model.loop_gate.numel()) - 1]
        s = out if t == 0 else s + g * (out - x)
        states.append(s)
    return states


@pytest.mark.parametrize("overrides", [{}, {"injection": "linear"}, {"step_embedding": True},
                                       {"prelude_layers": 0, "coda_layers": 0}])
def test_gated_loops_after_the_first_are_exact_no_ops_at_the_start(make_config, overrides):
    gated = _model(make_config, recurrence="gated", **overrides).eval()
    plain = _model(make_config, **overrides).eval()  # same seed: the same weights
    ids = torch.randint(1, 48, (2, 9), generator=torch.Generator().manual_seed(1))
    logits = gated.logits_by_loops(ids, [1, 2, 3, 5, 8])
    assert torch.equal(logits[1], plain.logits_at(ids, 1))  # loop 1 is the plain loop
    for h in (2, 3, 5, 8):
        assert torch.equal(logits[h], logits[1]), h
    assert not torch.equal(plain.logits_at(ids, 3), logits[1])  # plain loops do change it


def test_gates_get_gradients_and_give_the_written_out_recurrence(make_config, make_batch):
    model = _model(make_config, recurrence="gated", loops=3).train()
    assert model.loop_gate.shape == (2,) and not model.loop_gate.any()
    batch = make_batch([[6, 5], [11]])
    losses = model.losses(batch, [1, 2, 3])
    (losses[2] + losses[3]).backward()
    assert model.loop_gate.grad is not None and (model.loop_gate.grad != 0).all()
    with torch.no_grad():
        model.loop_gate.copy_(torch.tensor([0.5, -0.3]))
    model.eval()
    ids = batch["input_ids"]
    reference = _reference_states(model, ids, 5)  # loops 4 and 5 reuse g_3
    ctx = model.embed(ids)
    state = None
    for t, expected in enumerate(reference):
        state = model.forward_loops(ctx, t, t + 1, state)
        torch.testing.assert_close(state, expected, rtol=0, atol=1e-6)
    together = model.losses(batch, [1, 2, 5])
    for h in (1, 2, 5):
        assert abs(together[h].item() - model.losses(batch, [h])[h].item()) <= 1e-6
    assert len({round(v.item(), 6) for v in together.values()}) == 3  # the gates now act


def test_noise_state_is_a_truncated_normal_in_training_and_zeros_outside(make_config):
    model = _model(make_config, state_init="noise", d_model=64, n_heads=2, init_std=0.05)
    ids = torch.randint(1, 48, (4, 64), generator=torch.Generator().manual_seed(2))
    ctx = model.train().embed(ids)
    torch.manual_seed(7)
    first = model.init_state(ctx)
    second = model.init_state(ctx)
    torch.manual_seed(7)
    again = model.init_state(ctx)
    assert torch.equal(first, again) and not torch.equal(first, second)
    assert first.shape == ctx.e.shape and first.dtype == ctx.e.dtype
    assert first.abs().max() <= NOISE_TRUNCATION * 0.05
    # a normal cut at ±3σ has std 0.9866σ
    assert abs(first.std().item() / 0.05 - 0.9866) < 0.02
    assert not model.eval().init_state(ctx).any()
    with torch.no_grad():  # training-mode readouts differ from pass to pass, eval ones do not
        model.train()
        a, b = model.readout_logits(model.forward_loops(ctx, 0, 2), ctx), \
            model.readout_logits(model.forward_loops(ctx, 0, 2), ctx)
    assert not torch.equal(a, b)
    model.eval()
    assert torch.equal(model.logits_at(ids, 2), model.logits_at(ids, 2))


def test_unknown_recurrence_or_state_init_is_refused(make_config):
    for key in ("recurrence", "state_init"):
        with pytest.raises(ConfigError, match=rf"^model\.{key} = 'bogus' is not allowed"):
            LoopedLM(make_config(**{key: "bogus"}))
