"""The command line: every stage listed, user errors as one line with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline_lib.cli import COMMAND_MODULES, build_parser, main


def test_help_lists_every_stage():
    out = subprocess.run([sys.executable, "-m", "pipeline_lib", "--help"], capture_output=True,
                         text=True, check=True).stdout
    for name in COMMAND_MODULES:
        assert name.replace("_", "-") in out, name


def test_every_command_parses_its_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(n.replace("_", "-") for n in COMMAND_MODULES)


def test_pipeline_error_is_one_line_exit_2(tmp_path, capsys):
    code = main(["pack", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: config file") and err.count("\n") == 1
    assert not (tmp_path / "d").exists()


def test_bad_override_is_one_line(tmp_path, capsys):
    assert main(["pack", "--out", str(tmp_path / "d"), "model.nope=1"]) == 2
    assert "unknown config key 'model.nope'" in capsys.readouterr().err


def test_track_init_with_no_track_records_tracking_off(tmp_path, capsys):
    data = tmp_path / "data"
    data.mkdir()
    (data / "metadata.json").write_text(json.dumps({"data_id": "abc", "num_docs": 3}))
    rc = main(["track-init", "--run-dir", str(tmp_path / "base"), "--data", str(data),
               "--no-track"])
    assert rc == 0 and capsys.readouterr().out.strip() == "tracking disabled"
    assert json.loads((tmp_path / "base" / "tracking.json").read_text())["enabled"] is False
