"""The H_eff sweep stage runs on experiment.device in experiment.precision (CPU here)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from support.precision_probe import linear_calls

from pipeline_lib.checkpoint.compat import snapshot_config
from pipeline_lib.device import resolve_device
from pipeline_lib.workflow.stages.heff import heff_stage


def _cfg(snap: Path, precision: str):
    cfg = snapshot_config(snap)
    return dataclasses.replace(
        cfg, experiment=dataclasses.replace(cfg.experiment, device="cpu", precision=precision),
        tracking=dataclasses.replace(cfg.tracking, enabled=False),
        eval=dataclasses.replace(cfg.eval, h_eff=[1, 3], max_tokens=300, batch_rows=4,
                                 adaptive=dataclasses.replace(cfg.eval.adaptive,
                                                              thresholds=[0.0, 0.01])))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_heff_stage_runs_on_the_configured_device_and_precision(tiny_run, tmp_path: Path,
                                                                precision: str) -> None:
    data_dir, snap = tiny_run
    cfg = _cfg(snap, precision)
    out = tmp_path / f"{precision}.json"
    with linear_calls() as calls:
        result = heff_stage(cfg, tmp_path / "run", snap, data_dir, out)
    device = resolve_device(cfg.experiment.device).type
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert calls and {(i, o) for i, o, _ in calls} == {(device, device)}
    assert {d for _, _, d in calls} == {dtype}  # the fixed sweep and the adaptive pass
    assert (result["device"], result["precision"]) == (device, precision)
    assert json.loads(out.read_text())["precision"] == precision
    assert result["adaptive_by_criterion"]["kl"]["points"][0]["loss"] == pytest.approx(result["losses"]["3"],
                                                                   rel=1e-6)


def test_bf16_sweep_is_close_to_fp32(tiny_run, tmp_path: Path) -> None:
    data_dir, snap = tiny_run
    r32 = heff_stage(_cfg(snap, "fp32"), tmp_path / "run", snap, data_dir, tmp_path / "a.json")
    r16 = heff_stage(_cfg(snap, "bf16"), tmp_path / "run", snap, data_dir, tmp_path / "b.json")
    assert r16["tokens"] == r32["tokens"]
    for h in ("1", "3"):
        assert r16["losses"][h] == pytest.approx(r32["losses"][h], rel=2e-2)
        assert r16["losses"][h] != r32["losses"][h]
