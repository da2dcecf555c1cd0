"""Run-level JSON lines: cut back to the resume step, streamed, copied into the snapshot."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline_lib.tracking import StageRun
from pipeline_lib.train.metrics import KEEP_EVENTS, TrainLog, cut_jsonl, scalar_metrics


def _write(path: Path, records: list[dict], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_cut_drops_later_steps_and_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _write(path, [{"step": s, "loss": 1.0} for s in (1, 2, 3, 4)], tail='{"step": 5, "lo')
    assert cut_jsonl(path, 2) == 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    assert cut_jsonl(path, 2) == 0
    assert cut_jsonl(tmp_path / "absent.jsonl", 0) == 0


def test_cut_keeps_abort_and_rollback_events(tmp_path: Path) -> None:
    path = tmp_path / "spike_events.jsonl"
    _write(path, [{"event": "skip", "step": 2}, {"event": "skip", "step": 5},
                  {"event": "abort", "step": 6}, {"event": "rollback", "step": 4}])
    cut_jsonl(path, 3, KEEP_EVENTS)
    assert [(e["event"], e["step"]) for e in map(json.loads, path.read_text().splitlines())] == \
        [("skip", 2), ("abort", 6), ("rollback", 4)]


def test_scalar_metrics_skip_non_numbers() -> None:
    record = {"step": 3, "loss": 2.0, "skipped": True, "cursor": [0, 8], "skip_reason": "x",
              "unroll_losses": [1.0], "val_loss": None, "loops": 4}
    assert scalar_metrics(record) == {"loss": 2.0, "skipped": 1.0, "loops": 4.0}


def test_train_log_streams_and_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stage = StageRun(None, None, "train")  # tracking disabled: the real no-op stage
    first = TrainLog(run, 0, stage=stage, tensorboard=False)
    for s in (1, 2, 3):
        first.step({"step": s, "loss": float(s), "cursor": [0, s], "grad_norm": float("nan")})
    first.event({"event": "skip", "step": 3})
    first.close()  # "crash" after step 3, with the snapshot at step 2
    second = TrainLog(run, 2, stage=stage, tensorboard=False)
    second.step({"step": 3, "loss": 30.0, "cursor": [0, 3]})
    assert second.commit(3) == 0
    files = second.snapshot_files()
    second.close()
    lines = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["loss"]) for m in lines] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert (run / "train" / "spike_events.jsonl").read_text() == ""
    assert files["metrics.jsonl"].count("\n") == 1 and files["spike_events.jsonl"] == ""


def test_disabled_log_writes_nothing(tmp_path: Path) -> None:
    log = TrainLog(tmp_path / "run", 0, enabled=False)
    log.step({"step": 1, "loss": 1.0})
    log.event({"event": "skip", "step": 1})
    assert log.commit(1) == 0 and not (tmp_path / "run").exists()
    log.close()
