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
threshold (:mod:`pipeline_lib.evaluate.exit.criteria`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..spec.names import IGNORE_INDEX
from .loss import readout_cross_entropy


def exit_step(log_survive: Tensor | None, gate_logits: Tensor) -> tuple[Tensor, Tensor]:
    """(log p(t), log survival after t) at readout t < T of its gate logits z [...] (fp32),
    given the log survival before t, Σ_{s<t} log(1 − λ_s) (None at t = 1: 0).

    log p(t) = Σ_{s<t} log(1 − λ_s) + log λ_t; the survival after t adds log(1 − λ_t); the
    remainder p(T) is the survival before T, and the cumulative exit probability after t is
    1 − exp(survival after t) = −expm1(…). The one place the distribution is computed: the
    training objective (:func:`expected_exit_forward`) and the ``gate`` criterion of
    adaptive exit (:mod:`pipeline_lib.evaluate.exit.criteria`) both step through it.
    """
    log_exit, log_stay = F.logsigmoid(gate_logits), F.logsigmoid(-gate_logits)
    if log_survive is None:
        return log_exit, log_stay
    return log_survive + log_exit, log_survive + log_stay


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
            log_p, log_survive = exit_step(log_survive, gate_logit(model, hidden))
        else:
            log_p = log_survive  # the remainder
        p = log_p.exp()
        ce = torch.zeros_like(w)
        objective = objective + readout_cross_entropy(
            hidden, weight, targets, chunk_size=model.cfg.loss_chunk_size, reduction="sum",
            token_weights=w * p.detach() / total, token_losses=ce)
        gate_term = gate_term + (w * (p - p.detach()) * ce).sum() / total
        entropy = entropy - p * log_p
        losses[h] = (w * ce).sum() / total
    assert state is not None
    objective = objective + gate_term - entropy_weight * (w * entropy).sum() / total
    return losses, objective, state
