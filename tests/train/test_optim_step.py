"""The shared optimizer step: the closure runs with gradients on and its loss comes back,
the update itself runs without autograd, for every optimizer the trainer writes itself."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.train.eager import EagerAdamW
from pipeline_lib.train.muon import MuonAdamW
from pipeline_lib.train.optim import AdamATan2
from pipeline_lib.train.optim_step import ClosureStep


def _adam_atan2(params: list[torch.nn.Parameter]) -> ClosureStep:
    return AdamATan2([{"params": params, "name": "decay"}], lr=0.1)


def _muon(params: list[torch.nn.Parameter]) -> ClosureStep:
    return MuonAdamW([{"params": params, "name": "muon"}], adamw=EagerAdamW, lr=0.1,
                     betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, momentum=0.9,
                     adjust_lr_fn="original")


@pytest.mark.parametrize("build", [_adam_atan2, _muon])
def test_step_evaluates_the_closure_with_grad_and_returns_its_loss(build) -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = build([w])
    assert isinstance(opt, ClosureStep)
    before, seen = w.detach().clone(), []

    def closure() -> float:
        seen.append(torch.is_grad_enabled())
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return float(loss.detach())

    with torch.no_grad():  # the closure gets gradients back on
        loss = opt.step(closure)
    assert seen == [True] and loss == float((before * before).sum())
    assert not torch.equal(w.detach(), before)  # and the update ran
    assert opt.step() is None  # without a closure: the update on the gradients there
