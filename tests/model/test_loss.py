"""chunked_cross_entropy against the eager loss: values and both gradients (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.model.loss import chunked_cross_entropy, readout_cross_entropy

ATOL, RTOL = 1e-5, 5e-4


def _inputs(n: int, d: int, v: int, ignore_every: int = 0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * 0.5
    targets = torch.randint(0, v, (n,), generator=gen)
    if ignore_every:
        targets[::ignore_every] = -100
    return hidden, weight, targets


def _value_and_grads(fn, hidden, weight, targets):
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    loss = fn(h, w, targets)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("n, chunk, ignore_every", [(64, 16, 0), (53, 16, 4), (37, 64, 3),
                                                    (29, 1, 5)])
def test_matches_eager_in_value_and_gradients(reduction, n, chunk, ignore_every):
    hidden, weight, targets = _inputs(n, 12, 301, ignore_every)
    got = _value_and_grads(lambda h, w, t: chunked_cross_entropy(
        h, w, t, chunk_size=chunk, reduction=reduction), hidden, weight, targets)
    ref = _value_and_grads(lambda h, w, t: F.cross_entropy(h @ w.T, t, reduction=reduction),
                           hidden, weight, targets)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_token_weights_give_the_weighted_loss(reduction):
    hidden, weight, targets = _inputs(41, 8, 97, ignore_every=6, seed=1)
    token_weights = torch.linspace(0.0, 3.0, 41)

    def eager(h, w, t):
        per_token = F.cross_entropy(h @ w.T, t, reduction="none")  # 0 where ignored
        total = (per_token * token_weights).sum()
        if reduction == "sum":
            return total
        return total / token_weights[t != -100].sum()

    got = _value_and_grads(lambda h, w, t: chunked_cross_entropy(
        h, w, t, chunk_size=10, reduction=reduction, token_weights=token_weights),
        hidden, weight, targets)
    ref = _value_and_grads(eager, hidden, weight, targets)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def test_upstream_gradient_scales_the_stored_gradients():
    hidden, weight, targets = _inputs(20, 8, 50, seed=2)
    got = _value_and_grads(lambda h, w, t: 3.5 * chunked_cross_entropy(h, w, t, chunk_size=6),
                           hidden, weight, targets)
    ref = _value_and_grads(lambda h, w, t: 3.5 * F.cross_entropy(h @ w.T, t),
                           hidden, weight, targets)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def test_all_targets_ignored_gives_zero_loss_and_zero_gradients():
    hidden, weight, _ = _inputs(9, 4, 11)
    targets = torch.full((9,), -100)
    loss, gh, gw = _value_and_grads(lambda h, w, t: chunked_cross_entropy(h, w, t, chunk_size=4),
                                    hidden, weight, targets)
    assert loss.item() == 0.0
    assert torch.count_nonzero(gh) == 0 and torch.count_nonzero(gw) == 0


def test_only_needed_gradients_are_computed():
    hidden, weight, targets = _inputs(16, 8, 30)
    h = hidden.clone().requires_grad_(True)
    loss = chunked_cross_entropy(h, weight, targets, chunk_size=5)
    loss.backward()
    ref_h = hidden.clone().requires_grad_(True)
    F.cross_entropy(ref_h @ weight.T, targets).backward()
    torch.testing.assert_close(h.grad, ref_h.grad, atol=ATOL, rtol=RTOL)
    assert weight.grad is None
    with torch.no_grad():  # forward only: same value, no graph
        value = chunked_cross_entropy(h, weight, targets, chunk_size=5)
    assert value.grad_fn is None
    torch.testing.assert_close(value, loss.detach())


def test_bad_arguments_raise():
    hidden, weight, targets = _inputs(4, 4, 8)
    with pytest.raises(ValueError, match="reduction"):
        chunked_cross_entropy(hidden, weight, targets, reduction="none")
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_cross_entropy(hidden, weight, targets, chunk_size=0)


def test_second_backward_through_one_loss_is_refused():
    hidden, weight, targets = _inputs(8, 4, 16)
    loss = chunked_cross_entropy(hidden.requires_grad_(True), weight, targets, chunk_size=3)
    (loss * 2).backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_readout_cross_entropy_casts_the_head_matmul_only_under_autocast() -> None:
    """The one readout-loss wrapper of ``LoopedLM.readout_loss`` and the expected-exit
    objective: the head matmul in the autocast dtype, the loss in fp32."""

    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(9, 8, generator=gen), torch.randn(13, 8, generator=gen)
    targets = torch.randint(0, 13, (9,), generator=gen)
    plain = readout_cross_entropy(hidden, weight, targets, chunk_size=4)
    assert plain.item() == chunked_cross_entropy(hidden, weight, targets, chunk_size=4).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = readout_cross_entropy(hidden, weight, targets, chunk_size=4)
    want = chunked_cross_entropy(hidden.bfloat16(), weight.bfloat16(), targets, chunk_size=4)
    assert cast.dtype == torch.float32 and cast.item() == want.item() != plain.item()
