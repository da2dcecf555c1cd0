"""The chunked distillation loss against the eager KL of materialised logits: value and
gradients, with token weights, ignored targets and chunks that do not
divide the rows; zero with zero gradients when the teacher is the student."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.model.distill import DistillTarget, chunked_kl
from pipeline_lib.model.loss import token_scale


def _eager(h, w, th, tw, scale):
    log_p = torch.log_softmax(th @ tw.T, dim=-1)
    log_q = torch.log_softmax(h @ w.T, dim=-1)
    return ((log_p.exp() * (log_p - log_q)).sum(-1) * scale).sum()


@pytest.mark.parametrize("chunk", [4, 5, 64])
def test_chunked_kl_equals_the_eager_kl_and_its_gradients(chunk: int) -> None:
    g = torch.Generator().manual_seed(0)
    N, D, Dt, V = 13, 8, 6, 11
    h = torch.randn(N, D, generator=g, requires_grad=True)
    w = torch.randn(V, D, generator=g, requires_grad=True)
    th, tw = torch.randn(N, Dt, generator=g), torch.randn(V, Dt, generator=g)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[[2, 7]] = -100
    scale = token_scale(targets, torch.rand(N, generator=g) + 0.5)
    assert scale[2] == scale[7] == 0 and float(scale.sum()) == pytest.approx(1.0)
    got = chunked_kl(h, w, th, tw, scale, chunk)
    got.backward()
    grads = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    want = _eager(h, w, th, tw, scale)
    want.backward()
    assert float(got) == pytest.approx(float(want), rel=1e-5) and float(got) > 0
    torch.testing.assert_close(grads[0], h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads[1], w.grad, rtol=1e-5, atol=1e-6)


def test_the_term_is_zero_with_zero_gradients_when_the_teacher_is_the_student() -> None:
    g = torch.Generator().manual_seed(1)
    h = torch.randn(9, 8, generator=g, requires_grad=True)
    w = torch.randn(5, 8, generator=g, requires_grad=True)
    target = DistillTarget(h.detach().clone(), w.detach().clone(), weight=3.0)
    term = target.term(h, w, torch.zeros(9, dtype=torch.long), None, chunk_size=4)
    term.backward()
    assert float(term) == 0.0 and float(target.kl[0]) == 0.0
    assert not h.grad.any() and not w.grad.any()
