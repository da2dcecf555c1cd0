"""Activation checkpointing (model.recompute): the same gradients, aux loss and MoE loads as
without it, for every backprop-through-loops shape, and the activations really recomputed."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.model import moe, recompute
from pipeline_lib.model.looped import LoopedLM

MOE = dict(moe_experts=4, moe_top_k=2, moe_aux_loss_weight=0.1)
# (readouts, no_grad_loops, unroll bounds): deep supervision, last, truncated, unrolled
SHAPES = {
    "deep": ([1, 2, 3], 0, [(0, 3)]),
    "last": ([3], 0, [(0, 3)]),
    "truncated": ([3], 2, [(0, 3)]),
    "unrolled_deep": (None, 0, [(0, 2), (2, 3)]),
}


@pytest.fixture
def build(make_config):
    """``build(mode, **model_overrides)``: the seeded tiny model with that checkpointing."""
    def make(mode: str, **kw) -> LoopedLM:
        torch.manual_seed(0)
        model = LoopedLM(make_config(**kw))
        model.activation_checkpointing = mode
        return model
    return make


@pytest.fixture
def batch(make_batch) -> dict:
    return make_batch([[5, 7], [12]], seed=3, answer_every=3)


def _pass(model: LoopedLM, batch: dict, shape: str) -> dict:
    """Forward + backward of ``batch`` the way ``shape`` runs it; what must not change."""
    readouts, no_grad, bounds = SHAPES[shape]
    calls = []
    handle = model.core[0].register_forward_pre_hook(lambda *_: calls.append(1))
    state, grads, losses, aux = None, [], [], []
    for start, end in bounds:
        counts = readouts or list(range(start + 1, end + 1))
        out = model(batch, counts, 2.0, no_grad_loops=no_grad, start=start, state=state)
        a = model.take_aux_loss()
        loss = torch.stack([out.losses[h] for h in counts]).mean()
        (loss + a).backward()
        state = out.state.detach()
        losses.append(loss.detach())
        aux.append(a.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        model.zero_grad(set_to_none=True)
    handle.remove()
    left = [t for _, layer in model.moe_layers() for t in layer.aux_terms]
    return {"grads": grads, "losses": losses, "aux": aux, "calls": len(calls), "left": left,
            "loads": [layer.load_counts.clone() for _, layer in model.moe_layers()]}


def _same(a: dict, b: dict) -> None:
    assert torch.equal(torch.stack(a["losses"]), torch.stack(b["losses"]))
    assert torch.equal(torch.stack(a["aux"]), torch.stack(b["aux"]))
    assert len(a["grads"]) == len(b["grads"])
    for ga, gb in zip(a["grads"], b["grads"], strict=True):
        assert ga.keys() == gb.keys()
        assert all(torch.equal(ga[n], gb[n]) for n in ga), [n for n in ga
                                                             if not torch.equal(ga[n], gb[n])]
    assert all(torch.equal(x, y) for x, y in zip(a["loads"], b["loads"], strict=True))
    assert not a["left"] and not b["left"]  # no aux term recorded by a recomputation


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("mode", ["loop", "block"])
def test_gradients_are_bit_identical_to_none(build, batch, arch: str, shape: str,
                                             mode: str) -> None:
    kw = MOE if arch == "moe" else {}
    ref = _pass(build("none", **kw), batch, shape)
    got = _pass(build(mode, **kw), batch, shape)
    _same(ref, got)
    with_grad = 3 - SHAPES[shape][1]
    assert got["calls"] == ref["calls"] + with_grad  # each loop with gradients ran again
    if arch == "moe":
        assert all(int(c.sum()) > 0 for c in got["loads"]) and float(got["aux"][0]) > 0


def test_the_recompute_marker_is_what_keeps_moe_loads_single(build, batch, monkeypatch) -> None:
    """Without the marker, recomputation counts every checkpointed MoE call again."""
    ref = _pass(build("none", **MOE), batch, "last")
    monkeypatch.setattr(moe, "recomputing", lambda: False)
    doubled = _pass(build("loop", **MOE), batch, "last")
    assert all(torch.equal(d, 2 * r) for d, r in zip(doubled["loads"], ref["loads"],
                                                       strict=True))
    assert doubled["left"]  # and the recomputed aux terms linger


def test_passes_without_gradients_are_not_checkpointed(build, make_batch, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("checkpoint called without gradients")

    monkeypatch.setattr(recompute, "checkpoint", refuse)
    model, plain = build("block", **MOE).eval(), build("none", **MOE).eval()
    batch = make_batch([[6, 6]], seed=1)
    with torch.no_grad():
        assert torch.equal(model.logits_at(batch, 2), plain.logits_at(batch, 2))
        assert torch.equal(model.losses(batch, [1, 3])[3], plain.losses(batch, [1, 3])[3])
    with pytest.raises(AssertionError, match="without gradients"):  # the patch is live
        model.losses(batch, [1])


def test_a_checkpointed_first_moe_call_probes_outside_the_recomputation(build, batch) -> None:
    """The grouped-kernel probe (once per process, with its own backward) may run inside a
    checkpointed piece; the recomputation, which finds it cached, must still match."""
    moe.reset_grouped_mm_choices()
    got = _pass(build("loop", **MOE), batch, "last")
    _same(_pass(build("none", **MOE), batch, "last"), got)
