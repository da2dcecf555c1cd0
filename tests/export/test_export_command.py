"""``python -m pipeline_lib export``: one-line errors for bad input, and the export directory
is either complete or absent (never half-written, no temporary sibling left behind)."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest
from support.export_helpers import random_model, write_model_snapshot

from pipeline_lib.cli import main
from pipeline_lib.data.tokenizer import byte_level_tokenizer
from pipeline_lib.export.hf import EXPORT_FILES


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    return write_model_snapshot(root / "snapshots" / "step_0000005", random_model("dense"),
                                byte_level_tokenizer())


def _export(capsys, snapshot: Path, out: Path, *extra: str) -> tuple[int, str]:
    code = main(["export", "--snapshot", str(snapshot), "--out", str(out), "--no-track", *extra])
    return code, capsys.readouterr().err.strip()


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}"))


def test_export_prints_its_provenance_and_replaces_a_previous_export(capsys, snapshot, tmp_path):
    out = tmp_path / "export"
    code = main(["export", "--snapshot", str(snapshot), "--out", str(out), "--no-track"])
    info = json.loads(capsys.readouterr().out)
    assert code == 0 and info["out"] == str(out) and info["step"] == 5
    (out / "stale.txt").write_text("from an older export")
    assert _export(capsys, snapshot, out)[0] == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(EXPORT_FILES)
    assert _leftovers(out) == []


def test_snapshot_failing_its_manifest_writes_nothing(capsys, snapshot, tmp_path):
    broken = tmp_path / "snapshots" / "step_0000005"
    broken.parent.mkdir()
    shutil.copytree(snapshot, broken)
    weights = bytearray((broken / "model.safetensors").read_bytes())
    weights[-1] ^= 0xFF
    (broken / "model.safetensors").write_bytes(bytes(weights))
    code, err = _export(capsys, broken, tmp_path / "export")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"error: snapshot {broken}: model.safetensors fails its sha256 check")
    assert not (tmp_path / "export").exists() and _leftovers(tmp_path / "export") == []


def test_missing_tokenizer_names_the_flag_that_supplies_one(capsys, tmp_path):
    tok = byte_level_tokenizer()
    snap = write_model_snapshot(tmp_path / "snapshots" / "step_0000005", random_model("dense"),
                                tok, with_tokenizer=False)
    code, err = _export(capsys, snap, tmp_path / "export")
    assert code == 2 and len(err.splitlines()) == 1
    assert "has no tokenizer.json" in err and "pass --tokenizer " in err
    assert not (tmp_path / "export").exists() and _leftovers(tmp_path / "export") == []
    (tmp_path / "tokenizer.json").write_text(tok.to_str())
    code, _ = _export(capsys, snap, tmp_path / "export", "--tokenizer",
                      str(tmp_path / "tokenizer.json"))
    assert code == 0 and (tmp_path / "export" / "tokenizer.json").read_text() == tok.to_str()


def test_out_holding_something_else_is_left_alone(capsys, snapshot, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, err = _export(capsys, snapshot, out)
    assert code == 2 and len(err.splitlines()) == 1
    assert err == (f"error: export directory {out} exists and is not a loopline export (no "
                   "config.json with model_type 'loopline'); pass a new --out or remove it")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    code, err = _export(capsys, snapshot, snapshot / "export")
    assert code == 2 and "lies inside the snapshot" in err
    assert not (snapshot / "export").exists()


def test_a_full_disk_mid_export_leaves_no_directory(capsys, snapshot, tmp_path, monkeypatch):
    import pipeline_lib.export.hf as hf

    def disk_full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(hf, "tokenizer_files", disk_full)  # after the weights are written
    code, err = _export(capsys, snapshot, tmp_path / "export")
    assert code == 2 and len(err.splitlines()) == 1
    assert "No space left on device" in err and "nothing was published" in err
    assert not (tmp_path / "export").exists() and _leftovers(tmp_path / "export") == []
