"""Learned exit gate (Ouro-style, Zhu et al. 2025, arXiv:2510.25741) and its training loss.

With ``model.exit_gate`` the model holds one ``nn.Linear(d_model, 1)`` shared by every loop:
after loop t it maps the readout hidden state h_t = norm(coda(state_t)) (what the head
reads) to an exit logit z_t, λ_t = sigmoid(z_t) per token. One shared map rather than one
per loop, because a shared gate reads out at any loop count, also past the training count
(test-time extrapolation), as the head does.

Exit distribution over the readouts 1..T of a pass, per token:
p(t) = λ_t · ∏_{s<t} (1 − λ_s) for t < T, and the remainder p(T) = ∏_{s<T} (1 − λ_s),
so Σ_t p(t) = 1 exactly in the math (computed in log space: log λ = logsigmoid(z),
log(1 − λ) = logsigmoid(−z)); the last loop's own logit is not used.

Objective ``expected_exit`` (one pass, the readouts of deep supervision):
L = Σ_t Σ_i wᵢ·pᵢ(t)·ℓᵢ(t) / Σ_i wᵢ − β · Σ_i wᵢ·H(pᵢ) / Σ_i wᵢ, with ℓᵢ(t) the
cross-entropy of token i read out after loop t, wᵢ its weight (answer weight, 0 where the
target is ignored) and β = ``train.exit_entropy_weight``. The entropy term keeps the gate
from collapsing onto one loop early in training.

The chunked loss never returns per-token losses with a graph, so each readout's term is
split: ``chunked_cross_entropy`` with token weights w·p(t) *detached* carries the gradient
into the hidden states and the head (and fills ℓ(t) as a side output), and
Σ wᵢ·(pᵢ(t) − sg[pᵢ(t)])·sg[ℓᵢ(t)] (zero in value) carries it into the gate. Value and
gradient equal those of the direct formula (the tests compare them).

At evaluation the cumulative exit probability after loop t is 1 − ∏_{s≤t} (1 − λ_s); the
``gate`` criterion of adaptive exit stops a token at the first loop where it passes the
threshold (:mod:`pipeline_lib.evaluate.exit_criteria`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..spec.names import IGNORE_INDEX
from .loss import chunked_cross_entropy


def exit_log_distribution(gate_logits: Tensor) -> Tensor:
    """log p(t) [T, …] of gate logits z [T, …] of readouts 1..T (see the module docstring)."""
    T = gate_logits.shape[0]
    log_stay = F.logsigmoid(-gate_logits.float())  # log(1 − λ_t)
    log_exit = F.logsigmoid(gate_logits.float())  # log λ_t
    # survival before t: Σ_{s<t} log(1 − λ_s), 0 at t = 1
    before = torch.cat([torch.zeros_like(log_stay[:1]), log_stay[:-1].cumsum(0)])
    if T == 1:
        return before  # one readout: p(1) = 1
    return torch.cat([before[:-1] + log_exit[:-1], before[-1:]])


def exit_distribution(gate_logits: Tensor) -> Tensor:
    """p(t) [T, …] of gate logits [T, …]: sums to 1 over t for every token."""
    return exit_log_distribution(gate_logits).exp()


def exit_cdf(gate_logits: Tensor) -> Tensor:
    """Cumulative exit probability [T, …] after loops 1..T: 1 − ∏_{s≤t} (1 − λ_s)."""
    return -torch.expm1(F.logsigmoid(-gate_logits.float()).cumsum(0))


def _weighted_ce(hidden: Tensor, weight: Tensor, targets: Tensor, token_weights: Tensor,
                 token_losses: Tensor, chunk_size: int) -> Tensor:
    """Σ wᵢ·ceᵢ by the chunked loss, under autocast as ``LoopedLM.readout_loss`` runs it
    (the head matmul in the autocast dtype, the loss in fp32)."""
    kind = hidden.device.type
    amp = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    with nullcontext() if amp is None else torch.autocast(kind, enabled=False):
        if amp is not None:
            hidden, weight = hidden.to(amp), weight.to(amp)
        return chunked_cross_entropy(hidden, weight, targets, chunk_size=chunk_size,
                                     reduction="sum", token_weights=token_weights,
                                     token_losses=token_losses)


def gate_logit(model: Any, hidden: Tensor) -> Tensor:
    """Exit logit [...] of readout hidden states [..., D] (fp32)."""
    assert model.exit_gate is not None, "the model has no exit gate (model.exit_gate)"
    return model.exit_gate(hidden).squeeze(-1).float()


def expected_exit_forward(model: Any, ctx: Any, readouts: Sequence[int],
                          token_weights: Tensor | None, entropy_weight: float, *,
                          no_grad_loops: int = 0) -> tuple[dict[int, Tensor], Tensor, Tensor]:
    """(mean loss per readout (detached), expected-exit objective, last state) of one pass.

    ``token_weights`` [B·L] (None = 1 per token) as :func:`.loss.token_weights` gives
    them; ignored targets weigh 0.
    """
    counts = sorted(set(int(h) for h in readouts))
    targets = ctx.targets.reshape(-1)
    w = (targets != IGNORE_INDEX).float()
    if token_weights is not None:
        w = w * token_weights.float()
    total = w.sum().clamp_min(1e-12)  # no scored token: loss 0, zero gradients
    weight = model.head_weight
    log_survive = torch.zeros_like(w)  # Σ_{s<t} log(1 − λ_s) per token
    gate_term, entropy = torch.zeros((), device=w.device), torch.zeros_like(w)
    objective, losses = torch.zeros((), device=w.device), {}
    state, t = None, 0
    for k, h in enumerate(counts):
        free = max(0, min(no_grad_loops - t, h - t))
        state = model.forward_loops(ctx, t, h, state, no_grad_loops=free)
        t = h
        hidden = model.readout_hidden(state, ctx).reshape(-1, weight.shape[1])
        if k < len(counts) - 1:
            z = gate_logit(model, hidden)
            log_p = log_survive + F.logsigmoid(z)
            log_survive = log_survive + F.logsigmoid(-z)
        else:
            log_p = log_survive  # the remainder
        p = log_p.exp()
        ce = torch.zeros_like(w)
        objective = objective + _weighted_ce(hidden, weight, targets, w * p.detach() / total,
                                             ce, model.cfg.loss_chunk_size)
        gate_term = gate_term + (w * (p - p.detach()) * ce).sum() / total
        entropy = entropy - p * log_p
        losses[h] = (w * ce).sum() / total
    assert state is not None
    objective = objective + gate_term - entropy_weight * (w * entropy).sum() / total
    return losses, objective, state
