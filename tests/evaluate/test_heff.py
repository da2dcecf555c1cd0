"""The one-pass H_eff sweep equals separate evaluations; its JSON and CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.heff import parse_h_eff, run_heff, sweep_result


def test_one_pass_sweep_equals_separate_evaluations(tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    sweep = run_heff(snap, data_dir, [1, 2, 4, 8], tmp_path / "all.json",
                     max_tokens=1000, batch_rows=4)
    for h in (1, 2, 4, 8):
        alone = run_heff(snap, data_dir, [h], tmp_path / f"h{h}.json", max_tokens=1000,
                         batch_rows=4)
        assert alone["tokens"] == sweep["tokens"]
        assert alone["losses"][str(h)] == pytest.approx(sweep["losses"][str(h)], rel=1e-6)
    assert sweep["step"] == 7
    assert sweep["tokens"] >= 1000
    assert json.loads((tmp_path / "all.json").read_text()) == sweep
    # An untrained model's losses differ across depth: the sweep really runs the loops.
    assert len({round(v, 6) for v in sweep["losses"].values()}) == 4


def test_sweep_result_flags():
    doc = sweep_result(3, {1: 2.0, 2: 1.5, 4: 1.5, 8: 1.4}, 100)
    assert doc["deeper_better"] is True and doc["best_h_eff"] == 8
    doc = sweep_result(3, {1: 2.0, 2: 1.5, 4: 1.7}, 100)
    assert doc["deeper_better"] is False and doc["best_h_eff"] == 2
    assert doc["perplexities"]["1"] == pytest.approx(7.389056, rel=1e-6)


@pytest.mark.parametrize("bad", ["", "0,1", "a,b"])
def test_bad_h_eff_list(bad: str):
    with pytest.raises(ConfigError, match="--h-eff"):
        parse_h_eff(bad)


def test_parse_h_eff_sorts_and_dedupes():
    assert parse_h_eff("8, 2,2,1") == [1, 2, 8]


def test_cli_writes_json(tiny_run, tmp_path: Path):
    data_dir, snap = tiny_run
    out = tmp_path / "cli.json"
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "heff", "--snapshot", str(snap), "--data",
         str(data_dir), "--h-eff", "1,3", "--out", str(out), "eval.max_tokens=300"],
        capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["losses"]) == {"1", "3"} and doc["tokens"] >= 300


def test_cli_missing_snapshot_is_one_line(tmp_path: Path, tiny_run):
    data_dir, _ = tiny_run
    result = subprocess.run(
        [sys.executable, "-m", "pipeline_lib", "heff", "--snapshot", str(tmp_path / "nope"),
         "--data", str(data_dir), "--h-eff", "1", "--out", str(tmp_path / "x.json")],
        capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "error:" in result.stderr
