"""The ``trajectories`` command: bad input is one ``error:`` line that writes nothing; a good
run writes its directory and is tracked as the child run ``trajectories/step_…``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support.credentials_helpers import free_port

from pipeline_lib.checkpoint.compat import snapshot_config
from pipeline_lib.cli import main
from pipeline_lib.tracking.outbox import Outbox
from pipeline_lib.workflow.stages.trajectories import trajectories_stage


def _argv(data_dir: Path, snap: Path, out: Path, *extra: str) -> list[str]:
    return ["trajectories", "--snapshot", str(snap), "--data", str(data_dir), "--out", str(out),
            "--no-track", *extra]


@pytest.mark.parametrize(("extra", "named"), [
    (("--tokens", "0"), "--tokens 0"),
    (("--tokens", "-3"), "--tokens -3"),
    (("--max-loops", "0"), "--max-loops 0"),
    (("--max-loops", "100000"), "--max-loops = 100000"),
])
def test_bad_counts_are_one_line(tiny_run, tmp_path: Path, capsys, extra, named) -> None:
    data_dir, snap = tiny_run
    rc = main(_argv(data_dir, snap, tmp_path / "out", *extra))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(lines) == 1 and named in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["data_dir", "missing", "empty"])
def test_a_snapshot_that_is_not_one_is_one_line(tiny_run, tmp_path: Path, capsys,
                                                which) -> None:
    data_dir, _ = tiny_run
    snap = {"data_dir": data_dir, "missing": tmp_path / "nothing", "empty": tmp_path / "e"}[which]
    if which == "empty":
        snap.mkdir()
    rc = main(_argv(data_dir, snap, tmp_path / "out"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(lines) == 1 and str(snap) in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_command_writes_its_directory(tiny_run, tmp_path: Path, capsys) -> None:
    data_dir, snap = tiny_run
    out = tmp_path / "out"
    assert main(_argv(data_dir, snap, out, "--tokens", "6", "--max-loops", "3")) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (printed["tokens"], printed["max_loops"], printed["training_loops"]) == (6, 3, 2)
    assert sorted(p.name for p in out.iterdir()) == ["trajectories.json", "trajectories.png"]


def test_the_stage_logs_per_loop_metrics_and_both_files(tiny_run, tmp_path: Path) -> None:
    """With the store down everything goes to the run's outbox, which shows what the stage
    logs: the measures at step = loop, the class shares, the two artifacts."""
    data_dir, snap = tiny_run
    cfg = snapshot_config(snap)
    cfg = dataclasses.replace(cfg, tracking=dataclasses.replace(
        cfg.tracking, enabled=True, uri=f"http://127.0.0.1:{free_port()}"))
    run_dir = tmp_path / "run"
    result = trajectories_stage(cfg, run_dir, snap, data_dir, tmp_path / "out", tokens=5)
    records = [record for _, record in Outbox(run_dir).lines() if record]
    metrics = {(key, step): value for r in records if r["op"] == "metrics"
               for key, value, step, _ in r["points"]}
    for i, loop in enumerate(result["loops"]):
        assert metrics[("trajectories/kl_to_final_mean", loop)] == pytest.approx(
            result["measures"]["kl_to_final"]["mean"][i])
    assert sum(v for (k, s), v in metrics.items() if k.endswith("_share")) == pytest.approx(1)
    child = next(r for r in records if r["op"] == "child")
    assert child["run_name"] == "trajectories/step_0000007"
    assert sorted(Path(r["path"]).name for r in records if r["op"] == "artifact"
                  and r["run"] == child["id"]) == ["trajectories.json", "trajectories.png"]
