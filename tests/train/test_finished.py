"""A finished segment's files stay in its resume point's slot (hard links), so a job of the
same segment whose output was deleted (Snakemake's cleanup after a lost session) adopts it
instead of training again; another segment, another signature or a damaged slot is not
adopted (pipeline_lib.train.finished, through the launcher every segment job runs)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from trainer_helpers import make_pack, metrics, snap, tiny_config

from pipeline_lib.spec.layout import RunLayout
from pipeline_lib.train.launch import run_training_job
from pipeline_lib.train.segment_start import segment_signature


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


def _slot(run: Path, step: int) -> Path:
    return RunLayout.at(run).resume_point(step)


def _trained(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "done in" in r.getMessage()]


def test_a_deleted_output_is_adopted_not_trained_again(
        pack: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run, cfg = tmp_path / "run", tiny_config()
    caplog.set_level(logging.INFO)
    run_training_job(cfg, pack, None, 3, snap(run, 3))
    weights = (snap(run, 3) / "model.safetensors").read_bytes()
    state = json.loads((_slot(run, 3) / "trainer_state.json").read_text())
    assert state["segments"][-1]["input"] is None
    assert state["segments"][-1]["signature"] == segment_signature(cfg, pack)
    shutil.rmtree(snap(run, 3))  # what Snakemake does to an output it takes for incomplete
    caplog.clear()
    run_training_job(cfg, pack, None, 3, snap(run, 3))
    assert not _trained(caplog)
    assert any("adopted its snapshot" in r.getMessage() for r in caplog.records)
    assert (snap(run, 3) / "model.safetensors").read_bytes() == weights
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]  # nothing logged again
    # the next segment consumes it: its slot goes, the new one's takes its place
    run_training_job(cfg, pack, snap(run, 3), 6, snap(run, 6))
    assert sorted(p.name for p in _slot(run, 0).parent.iterdir()) == ["step_0000006"]
    assert (_slot(run, 6) / "model.safetensors").stat().st_ino == \
        (snap(run, 6) / "model.safetensors").stat().st_ino


def test_another_signature_or_a_damaged_slot_trains_again(
        pack: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    caplog.set_level(logging.INFO)
    run_training_job(tiny_config(), pack, None, 3, snap(run, 3))
    shutil.rmtree(snap(run, 3))
    caplog.clear()
    run_training_job(tiny_config("train.lr=0.001"), pack, None, 3, snap(run, 3))  # a new lr
    assert len(_trained(caplog)) == 1 and "was made under train signature" in caplog.text
    shutil.rmtree(snap(run, 3))
    with open(_slot(run, 3) / "model.safetensors", "r+b") as fh:  # one flipped byte
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 1]))
    caplog.clear()
    run_training_job(tiny_config("train.lr=0.001"), pack, None, 3, snap(run, 3))
    assert len(_trained(caplog)) == 1 and "not adopting" in caplog.text
    assert [m["step"] for m in metrics(run)] == [1, 2, 3]
