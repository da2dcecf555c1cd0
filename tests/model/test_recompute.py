"""Activation checkpointing (model.recompute): the same gradients, aux loss and MoE loads as
without it, for every backprop-through-loops shape, and the activations really recomputed."""

from __future__ import annotations

import pytest
import torch
from conftest import packed_batch, tiny_config

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


def _model(mode: str, **kw) -> LoopedLM:
    torch.manual_seed(0)
    model = LoopedLM(tiny_config(**kw))
    model.activation_checkpointing = mode
    return model


def _pass(model: LoopedLM, shape: str) -> dict:
    """Forward + backward of one batch the way ``shape`` runs it; what must not change."""
    batch = packed_batch([[5, 7], [12]], seed=3, answer_every=3)
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
def test_gradients_are_bit_identical_to_none(arch: str, shape: str, mode: str) -> None:
    kw = MOE if arch == "moe" else {}
    ref = _pass(_model("none", **kw), shape)
    got = _pass(_model(mode, **kw), shape)
    _same(ref, got)
    with_grad = 3 - SHAPES[shape][1]
    assert got["calls"] == ref["calls"] + with_grad  # each loop with gradients ran again
    if arch == "moe":
        assert all(int(c.sum()) > 0 for c in got["loads"]) and float(got["aux"][0]) > 0


def test_the_recompute_marker_is_what_keeps_moe_loads_single(monkeypatch) -> None:
    """Without the marker, recomputation counts every checkpointed MoE call again."""
    ref = _pass(_model("none", **MOE), "last")
    monkeypatch.setattr(moe, "recomputing", lambda: False)
    doubled = _pass(_model("loop", **MOE), "last")
    assert all(torch.equal(d, 2 * r) for d, r in zip(doubled["loads"], ref["loads"],
                                                       strict=True))
    assert doubled["left"]  # and the recomputed aux terms linger


def test_passes_without_gradients_are_not_checkpointed(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("checkpoint called without gradients")

    monkeypatch.setattr(recompute, "checkpoint", refuse)
    model, plain = _model("block", **MOE).eval(), _model("none", **MOE).eval()
    batch = packed_batch([[6, 6]], seed=1)
    with torch.no_grad():
        assert torch.equal(model.logits_at(batch, 2), plain.logits_at(batch, 2))
        assert torch.equal(model.losses(batch, [1, 3])[3], plain.losses(batch, [1, 3])[3])
    with pytest.raises(AssertionError, match="without gradients"):  # the patch is live
        model.losses(batch, [1])


def test_a_checkpointed_first_moe_call_probes_outside_the_recomputation() -> None:
    """The grouped-kernel probe (once per process, with its own backward) may run inside a
    checkpointed piece; the recomputation, which finds it cached, must still match."""
    moe.reset_grouped_mm_choices()
    got = _pass(_model("loop", **MOE), "last")
    _same(_pass(_model("none", **MOE), "last"), got)
