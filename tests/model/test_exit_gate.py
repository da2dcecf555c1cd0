"""The learned exit gate: its exit distribution and the expected-exit loss, against direct
computations."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.model.exit_gate import exit_step
from pipeline_lib.model.looped import LoopedLM


def _distribution(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p(t) [T, …] over readouts 1..T and the cumulative exit probability [T−1, …] after
    loops 1..T−1, stepped through :func:`exit_step` as the objective and the gate criterion
    step through it."""
    log_p, cdf, survive = [], [], None
    for t in range(z.shape[0] - 1):
        exit_now, survive = exit_step(survive, z[t].float())
        log_p.append(exit_now)
        cdf.append(-torch.expm1(survive))
    log_p.append(survive if survive is not None else torch.zeros_like(z[0]))  # the remainder
    return torch.stack(log_p).exp(), torch.stack(cdf) if cdf else z[:0]


def test_exit_distribution_sums_to_one_and_matches_the_product() -> None:
    z = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)) * 3
    p, cdf = _distribution(z)
    torch.testing.assert_close(p.sum(0), torch.ones(7), rtol=0, atol=1e-6)
    lam = torch.sigmoid(z)
    direct = [lam[t] * torch.prod(1 - lam[:t], 0) for t in range(4)] + [torch.prod(1 - lam[:4], 0)]
    torch.testing.assert_close(p, torch.stack(direct), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(cdf, torch.cumsum(p, 0)[:4], rtol=1e-5, atol=1e-6)
    assert _distribution(z[:1])[0].tolist() == [[1.0] * 7]  # one readout: it takes it all


def test_zero_gate_logits_give_halving_exit_probabilities() -> None:
    p, _ = _distribution(torch.zeros(4, 2))
    assert p[:, 0].tolist() == [0.5, 0.25, 0.125, 0.125]  # λ = 0.5; the remainder at loop 4


def _direct_objective(model: LoopedLM, batch, counts, beta: float, answer_weight: float):
    """Σ_t Σ_i wᵢ pᵢ(t) ℓᵢ(t) / Σ wᵢ − β Σ wᵢ H(pᵢ) / Σ wᵢ with eager logits and products."""
    ctx = model.embed(batch)
    targets = batch["targets"].reshape(-1)
    w = (targets != -100).float()
    if "answer_mask" in batch:
        w = w * torch.where(batch["answer_mask"].reshape(-1), answer_weight, 1.0)
    state, t, ces, lams = None, 0, [], []
    for h in counts:
        state = model.forward_loops(ctx, t, h, state)
        t = h
        hidden = model.readout_hidden(state, ctx).reshape(-1, model.cfg.d_model)
        logits = F.linear(hidden, model.head_weight).float()
        ces.append(F.cross_entropy(logits, targets.clamp_min(0), reduction="none"))
        lams.append(torch.sigmoid(model.exit_gate(hidden).squeeze(-1)))
    ps, stay = [], torch.ones_like(w)
    for k in range(len(counts)):
        last = k == len(counts) - 1
        ps.append(stay if last else lams[k] * stay)
        stay = stay * (1 - lams[k])
    loss = sum((w * p * ce).sum() for p, ce in zip(ps, ces, strict=True)) / w.sum()
    entropy = -sum(p * torch.log(p) for p in ps)
    return loss - beta * (w * entropy).sum() / w.sum(), [(w * ce).sum() / w.sum() for ce in ces]


@pytest.mark.parametrize("coda", [0, 1])
def test_expected_exit_loss_and_gradients_equal_the_direct_formula(make_config, make_batch,
                                                                   coda: int) -> None:
    torch.manual_seed(1)
    model = LoopedLM(make_config(exit_gate=True, coda_layers=coda, init_std=0.2))
    with torch.no_grad():
        model.exit_gate.weight.normal_(std=1.0)  # gates far from 0.5: a real test of p
    batch = make_batch([[5, 6], [11]], answer_every=3)
    counts, beta = [1, 2, 3], 0.05
    out = model(batch, counts, 2.0, exit_entropy_weight=beta)
    out.objective.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    want, per_loop = _direct_objective(model, batch, counts, beta, 2.0)
    want.backward()
    torch.testing.assert_close(out.objective, want, rtol=1e-5, atol=1e-6)
    for h, value in zip(counts, per_loop, strict=True):
        torch.testing.assert_close(out.losses[h], value.detach(), rtol=1e-5, atol=1e-6)
    assert got["exit_gate.weight"].abs().sum() > 0  # the gate learns
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_zero_gate_weights_weigh_the_loop_losses_by_halves(make_config, make_batch) -> None:
    torch.manual_seed(2)
    model = LoopedLM(make_config(exit_gate=True, loops=4))
    with torch.no_grad():
        model.exit_gate.weight.zero_()
        model.exit_gate.bias.zero_()
    batch = make_batch([[9, 7]])
    out = model(batch, [1, 2, 3, 4], exit_entropy_weight=0.1)
    fixed = model.losses(batch, [1, 2, 3, 4])
    p = [0.5, 0.25, 0.125, 0.125]
    entropy = -sum(x * math.log(x) for x in p)
    want = sum(x * fixed[h] for x, h in zip(p, [1, 2, 3, 4], strict=True)) - 0.1 * entropy
    torch.testing.assert_close(out.objective, want, rtol=1e-6, atol=1e-6)
    assert all(torch.equal(out.losses[h], fixed[h]) or
               torch.allclose(out.losses[h], fixed[h], rtol=1e-6) for h in fixed)
