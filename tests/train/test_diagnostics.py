"""Diagnostics: activation RMS per block (hooks only while attached), gradient norms, λ."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.train.diagnostics import (
    ActivationProbe,
    due,
    gradient_metrics,
    model_scalars,
    named_blocks,
)


def _model() -> LoopedLM:
    torch.manual_seed(0)
    return LoopedLM(ModelConfig(vocab_size=30, d_model=16, n_heads=2, loops=3,
                                learn_injection_scale=True, injection_scale=0.5))


def test_probe_records_every_block_call_and_detaches() -> None:
    model = _model()
    ids = torch.randint(0, 30, (2, 8))
    probe = ActivationProbe(model)
    with probe.attached():
        out = model.forward_loops(model.embed(ids), 0, 3)
    assert probe.counts == {"prelude.0": 1, "core.0": 3}
    assert probe.last["core.0"] == float(out.detach().pow(2).mean().sqrt())
    metrics = probe.metrics()
    assert set(metrics) == {"diag/act_rms/prelude.0", "diag/act_rms/core.0",
                            "diag/act_rms/core.0/last"}
    model.forward_loops(model.embed(ids), 0, 3)
    assert probe.counts["core.0"] == 3  # hooks are gone


def test_gradient_norms_and_scalars() -> None:
    model = _model()
    ids = torch.randint(0, 30, (2, 8))
    model.losses({"input_ids": ids, "targets": ids}, [3])[3].backward()
    grads = gradient_metrics(model)
    assert [k.split("/")[-1] for k in grads] == ["prelude.0", "core.0", "coda.0", "tok_emb",
                                                "norm"]
    expected = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.core[0].parameters()))
    assert grads["diag/grad_norm/core.0"] == pytest.approx(expected, rel=1e-6)
    assert model_scalars(model) == {"diag/injection_scale": 0.5}
    gated = LoopedLM(ModelConfig(vocab_size=30, d_model=16, n_heads=2, loops=3,
                                 recurrence="gated", injection="linear"))
    with torch.no_grad():
        gated.loop_gate.copy_(torch.tensor([0.25, -0.5]))
    assert model_scalars(gated) == {"diag/injection_scale": 1.0, "diag/loop_gate/2": 0.25,
                                    "diag/loop_gate/3": -0.5}
    assert [n for n, _ in named_blocks(model)] == ["prelude.0", "core.0", "coda.0"]
    assert due(6, 3) and not due(5, 3) and not due(6, 0)
