"""The one-command device check on this CPU: the real checks, the table, the JSON line, the exit
status; a check that fails is reported and the others still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.cli import main

ROOT = Path(__file__).resolve().parents[2]


def report(capsys: pytest.CaptureFixture) -> tuple[list[str], dict]:
    lines = capsys.readouterr().out.strip().splitlines()
    return lines[:-1], json.loads(lines[-1])


def test_device_check_passes_on_the_cpu(tmp_path: Path, capsys) -> None:
    rc = main(["device-check", "--skip", "flex_attention", "--work-dir", str(tmp_path),
               "experiment.device=cpu"])
    table, result = report(capsys)
    assert rc == 0, table
    assert table[0].startswith("device check: device cpu, resolved cpu, torch ")
    checks = result["checks"]
    assert list(checks) == ["train_steps", "snapshot_resume", "moe_grouped_mm", "generation"]
    assert all(c["status"] == "pass" for c in checks.values()), checks
    assert [row.split()[:2] for row in table[2:]] == [[name, "pass"] for name in checks]
    train = checks["train_steps"]
    assert (train["precision"], train["attention"]) == ("fp32", "sdpa")
    assert train["tokens_per_s"] > 0 and train["last_loss"] < train["first_loss"]
    resume = checks["snapshot_resume"]
    assert resume["losses_identical"] is True and resume["max_weight_diff"] == 0.0
    moe = checks["moe_grouped_mm"]
    assert (moe["max_diff"], moe["width_58"], moe["dtype"]) == (0.0, "loop", "float32")
    assert checks["generation"]["identical"] is True and checks["generation"]["new_tokens"] > 0
    # what the checks wrote stays in --work-dir: the pack and both runs
    assert (tmp_path / "whole" / "snapshots" / "step_0000004" / "MANIFEST.json").is_file()
    assert (tmp_path / "split" / "snapshots" / "step_0000004").is_dir()


def test_a_failing_check_is_reported_and_the_rest_still_run(tmp_path: Path, capsys) -> None:
    blocked = tmp_path / "not_a_dir"
    blocked.write_text("a file where the checks want their work directory")
    rc = main(["device-check", "--only", "train_steps", "moe_grouped_mm", "--work-dir",
               str(blocked), "experiment.device=cpu"])
    table, result = report(capsys)
    assert rc == 1
    train = result["checks"]["train_steps"]
    assert train["status"] == "fail" and "not_a_dir" in train["detail"]
    assert "\n" not in train["detail"]
    assert result["checks"]["moe_grouped_mm"]["status"] == "pass"
    assert table[2].split()[:2] == ["train_steps", "fail"]
    assert blocked.read_text().startswith("a file")  # nothing written over it


@pytest.mark.slow
def test_the_benchmark_script_runs_every_check(tmp_path: Path) -> None:
    """``benchmarks/device_check.py``, all five checks, FlexAttention compiled on the CPU."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_check.py"),
                          "--work-dir", str(tmp_path), "experiment.device=cpu"],
                         capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    checks = json.loads(out.stdout.strip().splitlines()[-1])["checks"]
    assert {name: c["status"] for name, c in checks.items()} == {
        "train_steps": "pass", "snapshot_resume": "pass", "flex_attention": "pass",
        "moe_grouped_mm": "pass", "generation": "pass"}
    flex = checks["flex_attention"]
    assert flex["recompiles_after_first_length"] == 0 and flex["max_diff"] <= 1e-4
    assert flex["detail"] == "forward only: no CPU backward"
