"""experiment.precision: resolved per device, one-line errors, the autocast it applies."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pipeline_lib.errors import ConfigError
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.precision import Precision, fp32
from pipeline_lib.spec.config_load import load_config

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


def test_auto_is_fp32_on_the_cpu_and_bf16_is_allowed_there() -> None:
    auto = Precision.resolve("auto", CPU)
    assert (auto.dtype, auto.name, auto.mixed) == (torch.float32, "fp32", False)
    with auto.autocast():
        assert not torch.is_autocast_enabled("cpu")
    bf16 = Precision.resolve("bf16", CPU)
    assert (bf16.dtype, bf16.name, bf16.mixed) == (torch.bfloat16, "bf16", True)
    with bf16.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert Precision.resolve("fp32", CPU) == fp32(CPU) == auto


def test_unknown_precision_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        Precision.resolve("fp16", CPU)
    assert str(info.value) == ("experiment.precision = 'fp16' is not allowed; use one of "
                               "['auto', 'bf16', 'fp32']")
    with pytest.raises(ConfigError) as info:
        load_config(None, ["experiment.precision=fp16"])
    text = str(info.value)
    assert "experiment.precision" in text and "fp16" in text and "\n" not in text


def test_bad_precision_stops_a_stage_before_it_starts(tmp_path: Path) -> None:
    """The CLI refuses the config with exit status 2 and one line, writing nothing."""
    out = tmp_path / "out.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "heff", "--snapshot", str(tmp_path / "none"),
         "--data", str(tmp_path / "none"), "--out", str(out), "--config",
         str(ROOT / "config" / "config.yaml"), "experiment.precision=half",
         "--no-track"], capture_output=True, text=True, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr[-1500:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "experiment.precision" in lines[0] and "half" in lines[0]
    assert not out.exists()


def _model() -> LoopedLM:
    from pipeline_lib.spec.config_model import ModelConfig

    torch.manual_seed(0)
    return LoopedLM(ModelConfig(vocab_size=40, d_model=16, n_heads=2, loops=2, init_std=0.2,
                                loss_chunk_size=5))


def test_autocast_training_step_keeps_fp32_weights_grads_and_loss() -> None:
    """Under bf16 autocast the matmuls run in bf16, the loss comes back fp32, parameters and
    their gradients stay fp32, and the loss is near (not equal to) the fp32 one."""
    model = _model()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (2, 12), generator=gen)
    batch = {"input_ids": ids, "targets": torch.roll(ids, -1, 1)}
    loss32 = model.losses(batch, [2])[2].detach()
    with Precision.resolve("bf16", CPU).autocast():
        loss16 = model.losses(batch, [1, 2])[2]
        hidden = model.readout_hidden(model.forward_loops(batch, 0, 1), model.context(batch))
        logits = model.logits_at(ids, 2)
    loss16.backward()
    assert loss16.dtype == torch.float32 and logits.dtype == torch.bfloat16
    assert hidden.dtype == torch.float32  # the residual stream and its norm stay fp32
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32
               for p in model.parameters() if p.requires_grad)
    assert loss16.item() != loss32.item()
    assert loss16.item() == pytest.approx(loss32.item(), rel=2e-2)


def test_autocast_loss_gradient_matches_fp32_roughly() -> None:
    model32, model16 = _model(), _model()
    ids = torch.randint(0, 40, (2, 10), generator=torch.Generator().manual_seed(2))
    batch = {"input_ids": ids, "targets": torch.roll(ids, -1, 1)}
    model32.losses(batch, [2])[2].backward()
    with Precision.resolve("bf16", CPU).autocast():
        loss = model16.losses(batch, [2])[2]
    loss.backward()
    g32 = torch.cat([p.grad.flatten() for p in model32.parameters() if p.grad is not None])
    g16 = torch.cat([p.grad.flatten() for p in model16.parameters() if p.grad is not None])
    cos = torch.nn.functional.cosine_similarity(g32, g16, dim=0)
    assert float(cos) > 0.99 and not torch.equal(g32, g16)


def test_resolve_names_the_key_it_was_given() -> None:
    with pytest.raises(ConfigError, match=r"^loopline model_args precision = 'x' is not "):
        Precision.resolve("x", CPU, key="loopline model_args precision")
    assert replace(fp32(CPU), device_type="cuda").name == "fp32"
