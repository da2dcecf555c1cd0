"""Chunked distillation loss: KL(teacher ‖ student) of two linear readouts, never more than
one chunk of [N, V] logits of each at a time.

``KL`` per token, averaged with the objective's token weights (the scale the chunked
cross-entropy of :mod:`.loss` uses: Σ wᵢ·klᵢ / Σ wᵢ over the scored targets), is what
:meth:`DistillTarget.term` adds to a readout's loss, times ``weight``. Like the chunked
cross-entropy, the forward pass leaves the finished gradients behind
(:class:`~.loss.ChunkGrads`): the gradient of klᵢ with respect to the student's logits z is
softmax(z) − softmax(z_teacher), so each chunk costs the two logit matmuls and the two
gradient matmuls, and backward only scales. No temperature: the distributions as they are
(a knob no experiment here sets). The teacher's hidden states arrive without gradients
(computed under no_grad); with a teacher equal to the student both distributions are the
same numbers and the term is exactly 0 with zero gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .loss import ChunkGrads, token_scale


def _log_softmax_(logits: Tensor) -> Tensor:
    """log softmax of [C, V], in place."""
    return logits.sub_(torch.logsumexp(logits, dim=1, keepdim=True))


class _ChunkedKL(torch.autograd.Function):
    """Σᵢ scaleᵢ·KL(teacher ‖ student)ᵢ, chunk by chunk, gradients computed in forward
    (:class:`~.loss.ChunkGrads`, as the chunked cross-entropy)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, teacher_hidden: Tensor,
                teacher_weight: Tensor, scale: Tensor, chunk_size: int,
                need_hidden_grad: bool, need_weight_grad: bool) -> Tensor:
        N = hidden.shape[0]  # hidden [N, D], weight [V, D]; teacher [N, Dt], [V, Dt]
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
        w_mat, t_mat = weight.to(dtype), teacher_weight.to(dtype)
        compute_grad = need_hidden_grad or need_weight_grad
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grads = ChunkGrads(hidden, weight, need_hidden_grad, need_weight_grad)
        for start in range(0, N, chunk_size):
            end = min(start + chunk_size, N)
            h_c = hidden[start:end].to(dtype)  # [C, D]
            log_q = _log_softmax_((h_c @ w_mat.T).float())  # student [C, V]
            log_p = _log_softmax_((teacher_hidden[start:end].to(dtype) @ t_mat.T).float())
            p = log_p.exp()  # teacher [C, V]
            kl = (p * (log_p - log_q)).sum(dim=1)  # [C]
            loss += (kl * scale[start:end]).sum()
            if compute_grad:  # d klᵢ / d zᵢ = q − p, times the token's scale
                grad_logits = log_q.exp_().sub_(p).mul_(scale[start:end, None])
                grads.add(start, end, grad_logits.to(dtype), h_c, w_mat)
        ctx.grads = grads
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        return *ctx.grads.take(grad_loss, "chunked_kl"), *(None,) * 6


def chunked_kl(hidden: Tensor, weight: Tensor, teacher_hidden: Tensor, teacher_weight: Tensor,
               scale: Tensor, chunk_size: int = 1024) -> Tensor:
    """Σᵢ scaleᵢ·KL(softmax(tᵢ) ‖ softmax(sᵢ)) with sᵢ = hidden[i] @ weight.T and
    tᵢ = teacher_hidden[i] @ teacher_weight.T (no gradient to the teacher); fp32 scalar.
    Equals the eager computation in value and gradients without holding more than
    ``chunk_size`` rows of either's logits."""
    if chunk_size < 1:
        raise ValueError(f"need chunk_size >= 1, got {chunk_size}")
    assert hidden.shape[0] == teacher_hidden.shape[0] == scale.shape[0]
    assert weight.shape[0] == teacher_weight.shape[0], "teacher and student vocabularies differ"
    grad_on = torch.is_grad_enabled()
    return _ChunkedKL.apply(hidden, weight, teacher_hidden.detach(), teacher_weight.detach(),
                            scale, chunk_size,
                            grad_on and hidden.requires_grad, grad_on and weight.requires_grad)


@dataclass
class DistillTarget:
    """The teacher's readout of one micro-batch and how much its KL term weighs."""

    hidden: Tensor  # [B·L, Dt], the teacher's norm(coda(state)), no gradient
    head: Tensor  # [V, Dt] the teacher's output projection
    weight: float
    kl: list[Tensor] = field(default_factory=list)  # detached KL of each readout scored

    def term(self, hidden: Tensor, head: Tensor, targets: Tensor, token_weights: Tensor | None,
             chunk_size: int) -> Tensor:
        """weight·(weighted mean KL) of a student readout ``hidden`` [B·L, D]; the KL
        itself is kept in :attr:`kl` (logged as ``distill_kl``)."""
        kl = chunked_kl(hidden, head, self.hidden, self.head, token_scale(targets, token_weights),
                        chunk_size)
        self.kl.append(kl.detach())
        return self.weight * kl
