"""Preemption-safe segments: SIGTERM/SIGUSR1 or the time limit stop a segment after a whole
step with a resume point; a retry continues from it and ends bit-identical."""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "train"))  # the trainer's helpers
from support.faults import FAULT_ENV  # noqa: E402
from trainer_helpers import (  # noqa: E402
    DATA,
    cli,
    config_file,
    make_pack,
    metrics,
    snap,
    tiny_config,
    uninterrupted_run,
)

from pipeline_lib.errors import PREEMPTED_EXIT, Preempted  # noqa: E402
from pipeline_lib.spec.data_id import data_id  # noqa: E402
from pipeline_lib.spec.signatures import train_signature  # noqa: E402
from pipeline_lib.train.job import train_segment  # noqa: E402
from pipeline_lib.train.segment_start import segment_signature  # noqa: E402

WAIT_S = 90


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pack(tmp_path_factory.mktemp("pack") / "data")


@pytest.fixture(scope="module")
def reference(pack: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run 0 → 3 → 6 (its run directory)."""
    return uninterrupted_run(pack, tmp_path_factory.mktemp("ref") / "run")


def resume_point(run: Path, until: int) -> Path:
    return run / "train" / "resume" / f"step_{until:07d}"


def _args(cfg: Path, pack: Path, run: Path, *, attempt: int = 1) -> list[str]:
    return ["--config", str(cfg), "--data", str(pack), "--resume-from", str(snap(run, 3)),
            "--until-step", "6", "--out", str(snap(run, 6)), "--attempt", str(attempt)]


def _signal_during_step(proc, marker: Path, sig: signal.Signals) -> tuple[int, str]:
    deadline = time.monotonic() + WAIT_S
    while not marker.exists():
        assert proc.poll() is None, f"ended before the pause: {proc.stdout.read()}"
        assert time.monotonic() < deadline, "timed out waiting for the pause"
        time.sleep(0.05)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_mid_segment_then_retry_is_exact(pack: Path, reference: Path, tmp_path: Path,
                                                sig: signal.Signals) -> None:
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    cfg = config_file(tmp_path / "cfg.yaml")
    stop_at = random.Random(sig).choice([4, 5])  # the signal lands during this step
    marker = tmp_path / "paused"
    proc = cli(_args(cfg, pack, run),
               env={FAULT_ENV: f"pause_step={stop_at},pause_s=2,pause_file={marker}"},
               faulty=True)
    rc, out = _signal_during_step(proc, marker, sig)
    assert rc == PREEMPTED_EXIT, out
    assert (f"stopped: segment 3→6 stopped by {sig.name} after step {stop_at}: resume point "
            f"{resume_point(run, 6)} written") in out
    assert "Traceback" not in out
    assert not snap(run, 6).exists()  # the job's output is not faked
    assert [m["step"] for m in metrics(run)] == list(range(1, stop_at + 1))
    state = json.loads((resume_point(run, 6) / "trainer_state.json").read_text())
    assert state["step"] == stop_at and state["preemptions"][-1]["reason"] == sig.name

    retry = cli(_args(cfg, pack, run, attempt=2))
    out, _ = retry.communicate(timeout=300)
    assert retry.returncode == 0, out
    assert (snap(run, 6) / "model.safetensors").read_bytes() == \
        (snap(reference, 6) / "model.safetensors").read_bytes()
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]  # each step once
    assert [m["loss"] for m in metrics(run)] == [m["loss"] for m in metrics(reference)]
    own = [json.loads(x) for x in (snap(run, 6) / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in own] == [4, 5, 6]  # the segment's own steps, all of them
    final = json.loads((snap(run, 6) / "trainer_state.json").read_text())
    assert [p["step"] for p in final["preemptions"]] == [stop_at]
    assert final["segments"][-1]["start_step"] == 3
    # the resume point gave way to the finished segment: its files, under a second name
    kept = resume_point(run, 6) / "model.safetensors"
    assert kept.stat().st_ino == (snap(run, 6) / "model.safetensors").stat().st_ino


def test_time_limit_stops_with_a_resume_point(pack: Path, reference: Path,
                                              tmp_path: Path) -> None:
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    # a 1-minute job with a 59.99-second margin: the deadline passes during the first step
    hurried = tiny_config("train.segment_runtime_minutes=1", "train.stop_margin_minutes=0.9999")
    with pytest.raises(Preempted, match=r"stopped by time limit .* after step 4"):
        train_segment(hurried, pack, snap(run, 3), 6, snap(run, 6), attempt=1)
    assert resume_point(run, 6).is_dir() and not snap(run, 6).exists()
    train_segment(tiny_config(), pack, snap(run, 3), 6, snap(run, 6), attempt=2)
    assert (snap(run, 6) / "model.safetensors").read_bytes() == \
        (snap(reference, 6) / "model.safetensors").read_bytes()
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4, 5, 6]


def test_a_resume_point_of_another_job_is_not_used(pack: Path, reference: Path,
                                                   tmp_path: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    run = tmp_path / "run"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    hurried = tiny_config("train.segment_runtime_minutes=1", "train.stop_margin_minutes=0.9999")
    with pytest.raises(Preempted):
        train_segment(hurried, pack, snap(run, 3), 6, snap(run, 6))
    # the same end step from another input (scratch): the leftover must not be continued
    train_segment(tiny_config(), pack, None, 6, run / "other" / "step_0000006", run_dir=run)
    assert "is not a resume point of this job" in caplog.text
    kept = json.loads((resume_point(run, 6) / "trainer_state.json").read_text())
    assert kept["preemptions"] == [] and kept["segments"][-1]["input"] is None  # the new job's
    assert ((run / "other" / "step_0000006" / "model.safetensors").read_bytes()
            == (snap(reference, 6) / "model.safetensors").read_bytes())


def test_a_resume_point_made_under_another_config_is_not_continued(
        pack: Path, tmp_path: Path) -> None:
    """A SIGTERM stops segment 3→6; then train.lr changes, so the run is retrained (segment
    0→3 again, then this job): the retry must start from its input, not from the resume
    point made under the old lr, and end as an uninterrupted run under the new config."""
    run, new = tmp_path / "run", "train.lr=0.001"
    train_segment(tiny_config(), pack, None, 3, snap(run, 3))
    marker = tmp_path / "paused"
    proc = cli(_args(config_file(tmp_path / "old.yaml"), pack, run),
               env={FAULT_ENV: f"pause_step=5,pause_s=2,pause_file={marker}"}, faulty=True)
    rc, out = _signal_during_step(proc, marker, signal.SIGTERM)
    assert rc == PREEMPTED_EXIT and resume_point(run, 6).is_dir(), out
    old = json.loads((resume_point(run, 6) / "trainer_state.json").read_text())
    assert old["preemptions"][-1]["signature"] == train_signature(tiny_config(), data_id(DATA))

    train_segment(tiny_config(new), pack, None, 3, snap(run, 3))  # the retrained input
    retry = cli(_args(config_file(tmp_path / "new.yaml", new), pack, run, attempt=2))
    out, _ = retry.communicate(timeout=300)
    assert retry.returncode == 0, out
    new_signature = train_signature(tiny_config(new), data_id(DATA))
    assert (f"resume point {resume_point(run, 6)} was made under train signature "
            f"{old['preemptions'][-1]['signature']}, this job's is {new_signature} (the config "
            f"changed since it stopped): not continued, removed; the segment starts from "
            f"{snap(run, 3)}") in out
    reference = uninterrupted_run(pack, tmp_path / "reference", new)
    assert (snap(run, 6) / "model.safetensors").read_bytes() == \
        (snap(reference, 6) / "model.safetensors").read_bytes()
    assert [m["loss"] for m in metrics(run)] == [m["loss"] for m in metrics(reference)]
    final = json.loads((snap(run, 6) / "trainer_state.json").read_text())
    assert final["preemptions"] == [] and final["segments"][-1]["start_step"] == 3
    slot = json.loads((resume_point(run, 6) / "trainer_state.json").read_text())  # the finished
    assert slot["segments"][-1]["signature"] == new_signature  # segment's files, not the old point


def test_the_segment_signature_is_the_workflow_train_signature(pack: Path) -> None:
    """What a resume point records is the segment rule's ``params.signature``: the train
    signature of the completed config and the pack's data id."""
    cfg = tiny_config()
    assert segment_signature(cfg, pack) == train_signature(cfg, data_id(DATA))
    assert segment_signature(tiny_config("experiment.seed=7"), pack) \
        != segment_signature(cfg, pack)
    assert segment_signature(tiny_config("train.segment_runtime_minutes=1",  # job time: the same
                                     "train.stop_margin_minutes=0.5"), pack) == \
        segment_signature(cfg, pack)


def test_the_deadline_is_runtime_minus_margin_and_off_at_margin_zero() -> None:
    from pipeline_lib.train.preempt import StopRequest

    train = tiny_config("train.segment_runtime_minutes=10").train
    now = time.monotonic()
    # started 9 minutes ago: inside a 5-minute margin of a 10-minute runtime, not of a 0.5
    late = dataclasses.replace(train, stop_margin_minutes=5.0)
    assert StopRequest(late, started=now - 540).requested() is not None
    early = dataclasses.replace(train, stop_margin_minutes=0.5)
    assert StopRequest(early, started=now - 540).requested() is None
    off = dataclasses.replace(train, stop_margin_minutes=0.0)  # only signals stop it
    assert StopRequest(off, started=now - 36000).requested() is None


def test_a_margin_that_leaves_no_time_is_a_config_error() -> None:
    from pipeline_lib.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.stop_margin_minutes = 5.0 leaves no time of "
                                          r"train.segment_runtime_minutes = 5"):
        tiny_config("train.segment_runtime_minutes=5")
