"""`python -m pipeline_lib pack`: same code path as the rule, one-line summary or error."""

from __future__ import annotations

import json

from pipeline_lib.cli import main


def test_pack_command_writes_the_pack_and_prints_one_line(tmp_path, capsys):
    config = tmp_path / "small.yaml"
    config.write_text("data:\n  sources:\n    - {type: reasoning, num_docs: 50, seed: 3}\n"
                      "  seq_len: 24\n  epochs: 1\n")
    out = tmp_path / "data" / "abc"
    assert main(["pack", "--config", str(config), "--out", str(out), "data.seed=2"]) == 0
    line = capsys.readouterr().out.strip()
    meta = json.loads((out / "metadata.json").read_text())
    assert "\n" not in line and line.startswith("packed 50 docs")
    assert f"{meta['rows_per_epoch']} rows/epoch × 1 epochs of 25 tokens" in line
    assert meta["seed"] == 2 and meta["seq_len"] == 24 and meta["num_docs"] == 50


def test_pack_command_reports_bad_input_as_one_line(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["pack", "--out", str(out), "data.curriculum_fraction=0",
                 "train.objective=deep_supervision",
                 f"data.sources=[{{type: parquet, path: '{tmp_path}/none/*.parquet'}}]"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert err.startswith("error: data.sources[0] (parquet") and "matches no files" in err
    assert not out.exists()
