"""Chunked linear cross-entropy: loss of ``hidden @ weight.T`` without the [N, V] logits.

The rows are processed ``chunk_size`` at a time. Each chunk's logits [C, V] are written into
one reused buffer, turned into the chunk's losses and, when a gradient will be needed,
*in place* into the gradient of the logits (softmax − one-hot, scaled by the token's
weight); two matmuls then give that chunk's share of d hidden and d weight. The forward pass
thus leaves the finished gradients behind and the backward pass only scales them (in place)
by the incoming scalar, as fused kernels such as Liger's FusedLinearCrossEntropy do: three
matmuls in all, one fewer than recomputing the logits in backward, and peak memory
O(C·V + V·D) instead of O(N·V). The price: each loss holds a [V, D] fp32 gradient until its
backward (one per readout when several loop counts are read out).

The per-chunk step (logsumexp, loss, gradient of the logits) runs in a Triton kernel on CUDA
(:mod:`.triton_loss`) and in torch elsewhere; the matmuls are torch's in both.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import Tensor

from ..spec.names import IGNORE_INDEX

REDUCTIONS = ("mean", "sum")


def _chunk_step_torch(logits: Tensor, targets: Tensor, scale: Tensor, ignore_index: int,
                      compute_grad: bool) -> Tensor:
    """Per-token CE of one chunk; overwrites ``logits`` [C, V] (fp32, owned) with its gradient.

    Returns losses [C] (0 where the target is ignored). After the call, when
    ``compute_grad``, ``logits[i] = scale[i]·(softmax(logits[i]) − onehot(targets[i]))``.
    """
    valid = targets != ignore_index
    safe_t = torch.where(valid, targets, 0)[:, None]  # [C, 1]
    target_logit = logits.gather(1, safe_t).squeeze(1)  # [C]
    row_max = logits.amax(dim=1, keepdim=True)  # [C, 1]
    logits.sub_(row_max).exp_()  # exp(x − max), in place: no second [C, V] buffer
    sum_exp = logits.sum(dim=1, keepdim=True)  # [C, 1]
    lse = (row_max + sum_exp.log()).squeeze(1)
    losses = torch.where(valid, lse - target_logit, 0.0)
    if compute_grad:
        logits.mul_(scale[:, None] / sum_exp)
        rows = torch.arange(logits.shape[0], device=logits.device)
        logits[rows, safe_t[:, 0]] -= scale  # scale is 0 for ignored targets
    return losses


def _chunk_step(backend: str):
    if backend == "triton":
        from .triton_loss import chunk_step_triton  # optional: triton (the triton extra), CUDA only

        return chunk_step_triton
    return _chunk_step_torch


def _resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be auto, torch or triton, not {backend!r}")
    if backend != "auto":
        return backend
    if device.type == "cuda":
        from .triton_loss import triton_available  # optional: triton (the triton extra), CUDA only

        if triton_available():
            return "triton"
    return "torch"


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and (when needed) both gradients, chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, token_weights: Tensor | None,
                chunk_size: int, ignore_index: int, reduction: str, backend: str,
                need_hidden_grad: bool, need_weight_grad: bool,
                token_losses: Tensor | None) -> Tensor:
        N = hidden.shape[0]  # hidden: [N, D], weight: [V, D], targets: [N]
        dtype = torch.promote_types(hidden.dtype, weight.dtype)
        w_mat = weight.to(dtype)
        scale = (token_scale(targets, token_weights, ignore_index) if reduction == "mean"
                 else scored_weights(targets, token_weights, ignore_index))
        compute_grad = need_hidden_grad or need_weight_grad
        step = _chunk_step(backend)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grads = ChunkGrads(hidden, weight, need_hidden_grad, need_weight_grad)
        # One [C, V] fp32 buffer reused by every chunk: no allocator churn of large blocks.
        buffer = torch.empty(min(chunk_size, N), weight.shape[0], dtype=torch.float32,
                             device=hidden.device)
        for start in range(0, N, chunk_size):
            end = min(start + chunk_size, N)
            h_c = hidden[start:end].to(dtype)  # [C, D]
            logits = buffer[: end - start]  # [C, V]
            if dtype == torch.float32:
                torch.mm(h_c, w_mat.T, out=logits)
            else:
                logits.copy_(h_c @ w_mat.T)
            losses = step(logits, targets[start:end], scale[start:end], ignore_index,
                          compute_grad)
            loss += (losses * scale[start:end]).sum()
            if token_losses is not None:  # side output, no gradient
                token_losses[start:end] = losses
            if compute_grad:  # logits now hold d loss / d logits
                grads.add(start, end, logits.to(dtype), h_c, w_mat)
        ctx.grads = grads
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        return *ctx.grads.take(grad_loss, "chunked_cross_entropy"), *(None,) * 9


class ChunkGrads:
    """The hidden and head gradients a chunked loss over ``hidden [N, D] @ weight.T`` computes
    in its forward, chunk by chunk, and hands to autograd in its backward (scaled there by
    the incoming gradient, in place: no second [V, D] buffer at the end of backward). Kept
    as a plain ``ctx`` attribute, not ``save_for_backward``."""

    def __init__(self, hidden: Tensor, weight: Tensor, need_hidden: bool,
                 need_weight: bool) -> None:
        self.hidden = torch.empty_like(hidden) if need_hidden else None
        self.weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                       if need_weight else None)
        self.weight_dtype = weight.dtype
        self.taken = False

    def add(self, start: int, end: int, grad_logits: Tensor, h_c: Tensor,
            w_mat: Tensor) -> None:
        """Rows ``start:end``'s share: ``grad_logits`` [C, V] = d loss / d logits."""
        if self.hidden is not None:
            self.hidden[start:end] = grad_logits @ w_mat
        if self.weight is not None:
            self.weight.addmm_(grad_logits.T.float(), h_c.float())

    def take(self, grad_loss: Tensor, name: str) -> tuple[Tensor | None, Tensor | None]:
        """(d hidden, d weight) times ``grad_loss``; once only."""
        if self.taken:
            raise RuntimeError(f"{name}: backward ran twice through the same loss "
                               "(retain_graph); compute the loss again instead")
        grad_hidden, grad_weight = self.hidden, self.weight
        self.hidden = self.weight = None
        self.taken = True
        if grad_hidden is not None:
            grad_hidden.mul_(grad_loss.to(grad_hidden.dtype))
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_loss).to(self.weight_dtype)
        return grad_hidden, grad_weight


def scored_weights(targets: Tensor, token_weights: Tensor | None,
                   ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Each token's loss weight [N]: ``token_weights`` (1 when None), 0 where ignored."""
    valid = targets != ignore_index
    return valid.float() if token_weights is None else token_weights.float() * valid


def token_scale(targets: Tensor, token_weights: Tensor | None,
                ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Each token's share of the weighted mean over the scored targets [N]; all 0 when
    nothing is scored (a loss of 0 with zero gradients, not 0/0)."""
    tok_w = scored_weights(targets, token_weights, ignore_index)
    total = tok_w.sum()
    return tok_w / torch.where(total > 0, total, torch.ones_like(total))


def token_weights(answer_mask: Tensor | None, answer_weight: float,
                  answer_only: bool = False) -> Tensor | None:
    """Per-token loss weights [B·L] (None = 1 each): ``answer_weight`` on ``answer_mask``
    [B, L] and 1 elsewhere; with ``answer_only`` 1 on the answer tokens and 0 elsewhere."""
    if answer_weight < 0:
        raise ValueError(f"answer_weight must be >= 0, got {answer_weight}")
    if answer_only:
        if answer_mask is None:
            raise ValueError("answer_only needs the batch's 'answer_mask'")
        return answer_mask.reshape(-1).float()  # 1 on answer tokens, 0 elsewhere
    if answer_mask is None or answer_weight == 1.0:
        return None
    return torch.where(answer_mask, float(answer_weight), 1.0).reshape(-1)


def chunked_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int = 1024,
                          ignore_index: int = IGNORE_INDEX, reduction: str = "mean",
                          token_weights: Tensor | None = None, backend: str = "auto",
                          token_losses: Tensor | None = None) -> Tensor:
    """Cross-entropy of ``hidden [N, D] @ weight.T [D, V]`` against ``targets [N]``.

    Equals ``F.cross_entropy(hidden @ weight.T, targets, ignore_index=..., reduction=...)`` in
    value and gradients, but never holds more than ``chunk_size`` rows of logits.
    ``token_weights [N]`` (optional, ≥ 0) makes it a weighted loss: ``sum`` gives
    Σ wᵢ·ceᵢ, ``mean`` gives Σ wᵢ·ceᵢ / Σ wᵢ over non-ignored tokens. With every target
    ignored the loss is 0 (F.cross_entropy gives nan). ``backend``: ``auto`` (Triton kernel
    on CUDA when importable, else torch), ``torch`` or ``triton`` (the latter also runs on
    CPU tensors under ``TRITON_INTERPRET=1``). Returns an fp32 scalar. ``token_losses``: an
    fp32 [N] tensor filled with every token's unweighted cross-entropy (0 where ignored),
    outside autograd (the expected-exit loss weighs them by exit probabilities).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, not {reduction!r}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
    assert hidden.dim() == 2 and weight.dim() == 2 and hidden.shape[1] == weight.shape[1]
    assert targets.shape == hidden.shape[:1]
    assert token_weights is None or token_weights.shape == targets.shape
    grad_on = torch.is_grad_enabled()
    return _ChunkedCrossEntropy.apply(
        hidden, weight, targets, token_weights, chunk_size, ignore_index, reduction,
        _resolve_backend(backend, hidden.device),
        grad_on and hidden.requires_grad, grad_on and weight.requires_grad, token_losses)


def readout_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk_size: int,
                          reduction: str = "mean", token_weights: Tensor | None = None,
                          token_losses: Tensor | None = None) -> Tensor:
    """:func:`chunked_cross_entropy` of readout rows [N, D] against the head [V, D] under the
    caller's autocast: the head matmul in the autocast dtype, the loss in fp32 (autocast is
    off inside, so the chunks' softmax is not cast down). The one wrapper of the readout
    losses: ``LoopedLM.readout_loss`` and the expected-exit objective (:mod:`.exit_gate`)."""
    kind = hidden.device.type
    amp = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None
    with nullcontext() if amp is None else torch.autocast(kind, enabled=False):
        if amp is not None:
            hidden, weight = hidden.to(amp), weight.to(amp)
        return chunked_cross_entropy(hidden, weight, targets, chunk_size=chunk_size,
                                     reduction=reduction, token_weights=token_weights,
                                     token_losses=token_losses)
