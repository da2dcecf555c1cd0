"""A segment in bf16 autocast on the CPU: every stage of it on experiment.device in the
configured precision (training, validation, samples), snapshots still fp32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.precision_probe import linear_calls
from trainer_helpers import make_pack, metrics, snap, tiny_config, weights

from pipeline_lib.train.job import train_segment

SHORT = ["train.total_steps=2", "train.steps_per_segment=2", "train.eval_interval=2",
         "train.sample_tokens=3", "train.eval_rows=4"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


def _segment(pack: Path, run: Path, precision: str) -> tuple[Path, list]:
    cfg = tiny_config(*SHORT, f"experiment.precision={precision}")
    with linear_calls() as calls:
        out = train_segment(cfg, pack, None, 2, snap(run, 2))
    return out, calls


def test_bf16_segment_computes_in_bf16_and_saves_fp32(pack: Path, tmp_path: Path) -> None:
    out16, calls16 = _segment(pack, tmp_path / "bf16", "bf16")
    out32, calls32 = _segment(pack, tmp_path / "fp32", "fp32")
    # the same calls (training, validation, greedy samples), on the configured device
    assert len(calls16) == len(calls32) > 0
    assert {(i, o) for i, o, _ in calls16} == {("cpu", "cpu")}
    assert {d for _, _, d in calls16} == {torch.bfloat16}
    assert {d for _, _, d in calls32} == {torch.float32}
    for name in ("model.safetensors", "optimizer.safetensors"):
        tensors = weights(out16, name)
        assert tensors and {t.dtype for t in tensors.values() if t.is_floating_point()} == \
            {torch.float32}, name
        assert weights(out32, name).keys() == tensors.keys()
    m16, m32 = metrics(tmp_path / "bf16"), metrics(tmp_path / "fp32")
    assert [m["step"] for m in m16] == [1, 2]
    for a, b in zip(m16, m32, strict=True):  # bf16 changes the numbers, a little
        assert a["loss"] == pytest.approx(b["loss"], rel=3e-2)
    assert [m["loss"] for m in m16] != [m["loss"] for m in m32]
    assert m16[-1]["val_loss"] == pytest.approx(m32[-1]["val_loss"], rel=3e-2)
    samples = (out16 / "samples.jsonl").read_text().splitlines()
    assert len(samples) == 2 and all('"completion_ids"' in s for s in samples)
