"""Fault tests through the CLI: SIGKILL mid-loop and mid-snapshot, then rerun to completion."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from support.faults import FAULT_ENV, SNAPSHOT_PAUSE_ENV
from trainer_helpers import (
    cli,
    config_file,
    make_pack,
    metrics,
    snap,
    tiny_config,
    uninterrupted_run,
)

from pipeline_lib.checkpoint.restore import load_snapshot
from pipeline_lib.cli import main
from pipeline_lib.errors import CheckpointError
from pipeline_lib.train.job import train_segment

WAIT_S = 90


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


@pytest.fixture(scope="module")
def reference(pack: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted in-process run 0 → 3 → 6 (its run directory)."""
    return uninterrupted_run(pack, tmp_path_factory.mktemp("ref") / "run")


def _wait_for(condition, proc, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"process ended before {what}: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _segment_args(cfg: Path, pack: Path, run: Path, start: int, end: int) -> list[str]:
    return ["--config", str(cfg), "--data", str(pack), "--resume-from", str(snap(run, start)),
            "--until-step", str(end), "--out", str(snap(run, end))]


def _finish(args: list[str]) -> None:
    proc = cli(args)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output


@pytest.mark.slow
def test_sigkill_mid_loop_then_rerun_is_exact(pack: Path, reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    cfg = config_file(tmp_path / "cfg.yaml")
    marker = tmp_path / "paused"
    proc = cli(_segment_args(cfg, pack, run, 3, 6),
               env={FAULT_ENV: f"pause_step=5,pause_s=120,pause_file={marker}"}, faulty=True)
    _wait_for(marker.exists, proc, "the pause before step 5")
    proc.kill()
    proc.wait()
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]  # the killed attempt's tail
    assert not snap(run, 6).exists()
    _finish(_segment_args(cfg, pack, run, 3, 6))
    assert (snap(run, 6) / "model.safetensors").read_bytes() == \
        (snap(reference, 6) / "model.safetensors").read_bytes()
    lines = metrics(run)
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 5, 6]
    assert [m["loss"] for m in lines] == [m["loss"] for m in metrics(reference)]


@pytest.mark.slow
def test_sigkill_mid_snapshot_write_then_rerun_is_exact(pack: Path, reference: Path,
                                                        tmp_path: Path) -> None:
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    cfg = config_file(tmp_path / "cfg.yaml")
    proc = cli(_segment_args(cfg, pack, run, 3, 6), env={SNAPSHOT_PAUSE_ENV: "120"}, faulty=True)
    snapshots = run / "snapshots"

    def half_written() -> list[Path]:
        return [p for p in snapshots.glob(".step_0000006*") if (p / "model.safetensors").exists()]

    _wait_for(lambda: bool(half_written()), proc, "a half-written snapshot")
    proc.kill()
    proc.wait()
    partial = half_written()[0]
    assert not snap(run, 6).exists()
    with pytest.raises(CheckpointError, match="MANIFEST"):
        load_snapshot(partial)
    _finish(_segment_args(cfg, pack, run, 3, 6))
    assert not partial.exists()  # the dead writer's temporary sibling was cleaned up
    assert (snap(run, 6) / "model.safetensors").read_bytes() == \
        (snap(reference, 6) / "model.safetensors").read_bytes()
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_cli_abort_then_retry_with_attempt_2(pack: Path, tmp_path: Path, inject_faults,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    cfg = config_file(tmp_path / "cfg.yaml", "train.spike.abort_consecutive=2")
    args = ["train", "--config", str(cfg), "--data", str(pack), "--resume-from", "none",
            "--until-step", "6", "--out", str(snap(run, 6))]
    inject_faults("spike_rows=24:40")  # steps 4 and 5
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "error: spike guard aborted at step 5" in err and "scratch" in err
    assert main([*args, "--attempt", "2"]) == 0
    assert "step 6/6" in capsys.readouterr().out
    state = json.loads((snap(run, 6) / "trainer_state.json").read_text())
    # past the window (rows 24-39) plus rollback_skip_steps = 10 steps of 8 rows: flat row
    # 120, i.e. row 10 of epoch 1 (the pack has 110 rows per epoch)
    assert [r["resume_cursor"] for r in state["rollbacks"]] == [[1, 10]]
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_a_rollback_record_of_another_config_is_not_applied(
        pack: Path, tmp_path: Path, inject_faults, capsys: pytest.CaptureFixture[str]) -> None:
    """A spike abort leaves rollback.json; then train.lr changes and the job is retried (a
    second attempt, now without the spike): the data window found under the old lr is not
    skipped, and the segment ends as an uninterrupted run under the new config."""
    run, new = tmp_path / "run", "train.lr=0.001"
    args = ["train", "--data", str(pack), "--resume-from", "none", "--until-step", "6",
            "--out", str(snap(run, 6))]
    old_cfg = config_file(tmp_path / "old.yaml", "train.spike.abort_consecutive=2")
    inject_faults("spike_rows=24:40")  # steps 4 and 5
    assert main([*args, "--config", str(old_cfg)]) == 2
    assert "error: spike guard aborted at step 5" in capsys.readouterr().err
    assert (run / "train" / "rollback.json").is_file()
    inject_faults("")
    new_cfg = config_file(tmp_path / "new.yaml", "train.spike.abort_consecutive=2", new)
    assert main([*args, "--config", str(new_cfg), "--attempt", "2"]) == 0
    state = json.loads((snap(run, 6) / "trainer_state.json").read_text())
    assert state["rollbacks"] == []
    assert [m["cursor"][1] for m in metrics(run)] == [0, 8, 16, 24, 32, 40]  # no jump
    assert not (run / "train" / "rollback.json").exists()  # stale: cleared at the end
    reference = tmp_path / "reference"
    train_segment(tiny_config("train.spike.abort_consecutive=2", new), pack, None, 6,
                  snap(reference, 6))
    assert (snap(run, 6) / "model.safetensors").read_bytes() == \
        (snap(reference, 6) / "model.safetensors").read_bytes()
