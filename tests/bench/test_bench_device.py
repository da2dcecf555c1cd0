"""The bench stage scores and generates on experiment.device in experiment.precision."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance
from snapshot_helpers import SEQ_LEN
from support.precision_probe import linear_calls

from pipeline_lib.bench import LooplineLM
from pipeline_lib.checkpoint.compat import snapshot_config
from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import BenchConfig
from pipeline_lib.workflow.stages.bench import bench_stage


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bench_stage_on_the_configured_device_and_precision(snapshot_dir: Path, tmp_path: Path,
                                                            precision: str) -> None:
    cfg = snapshot_config(snapshot_dir)
    bench = BenchConfig(tasks=["loopline_khop", "loopline_addition"], examples_per_level=1,
                        min_difficulty=1, max_difficulty=2, batch_size=4, max_gen_toks=4,
                        h_eff=[2])
    cfg = dataclasses.replace(
        cfg, bench=bench, tracking=dataclasses.replace(cfg.tracking, enabled=False),
        experiment=dataclasses.replace(cfg.experiment, device="cpu", precision=precision))
    with linear_calls() as calls:
        report = bench_stage(cfg, tmp_path / "run", snapshot_dir, tmp_path / "b.json",
                             tmp_path / "tasks")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert calls and {(i, o) for i, o, _ in calls} == {("cpu", "cpu")}
    assert {d for _, _, d in calls} == {dtype}  # loglikelihood and generation alike
    assert set(report["tasks"]) == {"loopline_khop", "loopline_addition"}
    assert report["tasks"]["loopline_khop"]["h_eff"]["2"]["overall"]["acc"] >= 0.0


def test_lm_in_bf16_scores_near_fp32_and_generates(trained_model, tokenizer) -> None:
    lms = {p: LooplineLM(model=trained_model, tokenizer=tokenizer, seq_len=SEQ_LEN, h_eff=2,
                         precision=p) for p in ("fp32", "bf16")}
    request = [Instance("loglikelihood", {}, ("345", "6789"), 0)]
    ll = {p: lm.loglikelihood(request, disable_tqdm=True)[0] for p, lm in lms.items()}
    assert ll["bf16"][0] == pytest.approx(ll["fp32"][0], abs=0.05) and ll["bf16"][1]
    gen = Instance("generate_until", {}, ("0", {"until": [], "max_gen_toks": 12}), 0)
    with linear_calls() as calls:
        text = lms["bf16"].generate_until([gen], disable_tqdm=True)
    assert text == ["123456789"] and {d for _, _, d in calls} == {torch.bfloat16}
    assert lms["bf16"].get_model_info()["precision"] == "bf16"


def test_bad_precision_model_arg_is_one_line(snapshot_dir: Path) -> None:
    with pytest.raises(ConfigError) as info:
        LooplineLM.create_from_arg_string(f"snapshot={snapshot_dir},h_eff=2,precision=fp16")
    assert str(info.value) == ("loopline model_args precision = 'fp16' is not allowed; use one "
                               "of ['auto', 'bf16', 'fp32']")
