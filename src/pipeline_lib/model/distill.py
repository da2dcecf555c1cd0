"""Chunked distillation loss: KL(teacher_T ‖ student_T) of two linear readouts, never more
than one chunk of [N, V] logits of each at a time.

``T²·KL`` per token, averaged with the objective's token weights (the scale the chunked
cross-entropy of :mod:`.loss` uses: Σ wᵢ·klᵢ / Σ wᵢ over the scored targets), is what
:meth:`DistillTarget.term` adds to a readout's loss, times ``weight``. Like the chunked
cross-entropy, the forward pass leaves the finished gradients behind: the gradient of
klᵢ with respect to the student's logits z is (softmax(z/T) − softmax(z_teacher/T)) / T, so
each chunk costs the two logit matmuls and the two gradient matmuls, and backward only
scales. The teacher's hidden states arrive without gradients (computed under no_grad);
with a teacher equal to the student both distributions are the same numbers and the term
is exactly 0 with zero gradients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..spec.names import IGNORE_INDEX


def _log_softmax_(logits: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / T) of [C, V], in place."""
    logits.div_(temperature)
    return logits.sub_(torch.logsumexp(logits, dim=1, keepdim=True))


class _ChunkedKL(torch.autograd.Function):
    """Σᵢ scaleᵢ·KL(teacher_T ‖ student_T)ᵢ, chunk by chunk, gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, teacher_hidden: Tensor,
                teacher_weight: Tensor, scale: Tensor, temperature: float, chunk_size: int,
                need_hidden_grad: bool, need_weight_grad: bool) -> Tensor:
        N = hidden.shape[0]  # hidden [N, D], weight [V, D]; teacher [N, Dt], [V, Dt]
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
        w_mat, t_mat = weight.to(dtype), teacher_weight.to(dtype)
        compute_grad = need_hidden_grad or need_weight_grad
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_hidden_grad else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                       if need_weight_grad else None)
        for start in range(0, N, chunk_size):
            end = min(start + chunk_size, N)
            h_c = hidden[start:end].to(dtype)  # [C, D]
            log_q = _log_softmax_((h_c @ w_mat.T).float(), temperature)  # student [C, V]
            log_p = _log_softmax_((teacher_hidden[start:end].to(dtype) @ t_mat.T).float(),
                                  temperature)  # teacher [C, V]
            p = log_p.exp()
            kl = (p * (log_p - log_q)).sum(dim=1)  # [C]
            loss += (kl * scale[start:end]).sum()
            if compute_grad:  # d klᵢ / d zᵢ = (q − p) / T, times the token's scale
                grad_logits = log_q.exp_().sub_(p).mul_(scale[start:end, None] / temperature)
                grad_logits = grad_logits.to(dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = grad_logits @ w_mat
                if grad_weight is not None:
                    grad_weight.addmm_(grad_logits.T.float(), h_c.float())
        ctx.grads = (grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        if ctx.grads is None:
            raise RuntimeError("chunked_kl: backward ran twice through the same loss")
        grad_hidden, grad_weight = ctx.grads
        ctx.grads = None
        if grad_hidden is not None:
            grad_hidden.mul_(grad_loss.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_loss).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def token_scale(targets: Tensor, token_weights: Tensor | None,
                ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Each token's share of a weighted mean over the scored targets [N] (0 where ignored;
    all 0 when nothing is scored): the same weights the objective's cross-entropy uses."""
    valid = targets != ignore_index
    tok_w = valid.float() if token_weights is None else token_weights.float() * valid
    total = tok_w.sum()
    return tok_w / torch.where(total > 0, total, torch.ones_like(total))


def chunked_kl(hidden: Tensor, weight: Tensor, teacher_hidden: Tensor, teacher_weight: Tensor,
               scale: Tensor, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """Σᵢ scaleᵢ·KL(softmax(tᵢ/T) ‖ softmax(sᵢ/T)) with sᵢ = hidden[i] @ weight.T and
    tᵢ = teacher_hidden[i] @ teacher_weight.T (no gradient to the teacher); fp32 scalar.
    Equals the eager computation in value and gradients without holding more than
    ``chunk_size`` rows of either's logits."""
    if chunk_size < 1 or temperature <= 0:
        raise ValueError(f"need chunk_size >= 1 and temperature > 0, got {chunk_size}, "
                         f"{temperature}")
    assert hidden.shape[0] == teacher_hidden.shape[0] == scale.shape[0]
    assert weight.shape[0] == teacher_weight.shape[0], "teacher and student vocabularies differ"
    grad_on = torch.is_grad_enabled()
    return _ChunkedKL.apply(hidden, weight, teacher_hidden.detach(), teacher_weight.detach(),
                            scale, float(temperature), chunk_size,
                            grad_on and hidden.requires_grad, grad_on and weight.requires_grad)


@dataclass
class DistillTarget:
    """The teacher's readout of one micro-batch and how much its KL term weighs."""

    hidden: Tensor  # [B·L, Dt], the teacher's norm(coda(state)), no gradient
    head: Tensor  # [V, Dt] the teacher's output projection
    weight: float
    temperature: float
    kl: list[Tensor] = field(default_factory=list)  # detached KL of each readout scored

    def term(self, hidden: Tensor, head: Tensor, targets: Tensor, token_weights: Tensor | None,
             chunk_size: int) -> Tensor:
        """weight·T²·(weighted mean KL) of a student readout ``hidden`` [B·L, D]; the KL
        itself is kept in :attr:`kl` (logged as ``distill_kl``)."""
        kl = chunked_kl(hidden, head, self.hidden, self.head, token_scale(targets, token_weights),
                        self.temperature, chunk_size)
        self.kl.append(kl.detach())
        return (self.weight * self.temperature ** 2) * kl
