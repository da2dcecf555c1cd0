"""Verified data: a pack is checked before it is trained on; a flipped byte in any file the
pack writes is refused with one line naming the file and the fix, and nothing is trained.
Later segments trust a verified-once marker bound to each file's identity (inode, size,
mtime_ns, ctime_ns), so the check costs a stat per file, yet a write after verification,
even one that sets the mtime back, is still caught."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline_lib.data import verify
from pipeline_lib.data.loader import PackedData
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.errors import DataError
from pipeline_lib.spec.config import DataConfig, SourceConfig

ROOT = Path(__file__).resolve().parents[2]
ARRAYS = ["tokens.bin", "docs.npy", "answer_spans.npy", "levels.npy",
          "train/epoch_0/doc_start.npy", "train/epoch_0/doc_len.npy",
          "train/epoch_0/row_ptr.npy", "val/doc_start.npy", "val/doc_len.npy",
          "val/row_ptr.npy", "tokenizer.json"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("rel_data") / "a1b2c3d4e5f6"
    pack_corpus(DataConfig(sources=[SourceConfig(type="reasoning", num_docs=40)], seq_len=16,
                           epochs=1, val_fraction=0.1), out)
    assert sorted(json.loads((out / "metadata.json").read_text())["arrays"]) == sorted(ARRAYS[:-1])
    return out


@pytest.fixture
def pack(packed: Path, tmp_path: Path) -> Path:
    """A private copy of the module's pack (new inodes: nothing verified yet)."""
    copy = tmp_path / "data" / packed.name
    shutil.copytree(packed, copy)
    return copy


def _flip(path: Path, offset: int = -1) -> None:
    """Flip the low bit of one byte in place (the file keeps its size)."""
    with open(path, "r+b") as fh:
        fh.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 1]))


def _one_line_naming(exc: BaseException, path: Path) -> str:
    text = str(exc)
    assert "\n" not in text
    assert str(path) in text and "re-pack" in text, text
    return text


@pytest.mark.parametrize("rel", ARRAYS)
def test_a_flipped_byte_in_any_pack_file_is_refused(pack: Path, rel: str) -> None:
    _flip(pack / rel, -1 if rel != "tokens.bin" else (pack / rel).stat().st_size // 2)
    with pytest.raises(DataError) as err:
        PackedData(pack)
    text = _one_line_naming(err.value, pack / rel)
    assert "does not match its sha256 in metadata.json" in text
    assert not verify.marker_path(pack).exists()  # nothing recorded as verified


def test_an_edited_metadata_value_is_refused(pack: Path) -> None:
    meta_path = pack / "metadata.json"
    meta = json.loads(meta_path.read_text())
    text = meta_path.read_text()
    needle = f'"rows_per_epoch": {meta["rows_per_epoch"]}'
    assert text.count(needle) == 1
    meta_path.write_text(text.replace(needle, f'"rows_per_epoch": {meta["rows_per_epoch"] - 1}'))
    with pytest.raises(DataError) as err:
        PackedData(pack)
    assert "does not match its own metadata_sha256" in _one_line_naming(err.value, meta_path)


def test_a_metadata_byte_that_breaks_the_json_is_refused(pack: Path) -> None:
    meta_path = pack / "metadata.json"
    _flip(meta_path, 0)  # '{' → 'z'
    with pytest.raises(DataError) as err:
        PackedData(pack)
    assert "is not valid JSON" in _one_line_naming(err.value, meta_path)


def test_verified_once_then_stat_only_and_a_later_write_is_still_caught(
        pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The marker records files only once they are older than the timestamp slack (2 s by
    # default); a short slack and a short wait stand for a pack made minutes earlier.
    monkeypatch.setattr(verify, "TIMESTAMP_SLACK_S", 0.05)
    time.sleep(0.15)
    first = PackedData(pack).verified
    files = set(ARRAYS)
    assert set(first.hashed) == files and first.trusted == [] and first.recorded
    second = PackedData(pack).verified
    assert second.hashed == [] and set(second.trusted) == files and not second.recorded

    tokens = pack / "tokens.bin"
    before = tokens.stat()
    _flip(tokens, before.st_size // 3)
    os.utime(tokens, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime set back
    assert tokens.stat().st_mtime_ns == before.st_mtime_ns
    with pytest.raises(DataError) as err:
        PackedData(pack)
    _one_line_naming(err.value, tokens)


def test_a_fresh_pack_is_hashed_until_it_is_old_enough_to_record(pack: Path) -> None:
    # Files changed within the slack of the check could still change unseen within the
    # same timestamp tick: they are hashed, not recorded.
    for path in pack.rglob("*"):
        if path.is_file():
            os.utime(path)  # (changes the ctime to now)
    report = PackedData(pack).verified
    assert report.hashed and not report.recorded
    assert PackedData(pack).verified.hashed == report.hashed


def test_full_verify_ignores_the_marker(pack: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify, "TIMESTAMP_SLACK_S", 0.0)
    data = PackedData(pack)
    assert data.verified.recorded
    report = verify.verify_pack(pack, data.metadata, use_marker=False)
    assert len(report.hashed) == len(ARRAYS) and report.trusted == []


def test_train_refuses_a_corrupt_pack_before_writing_anything(pack: Path, tmp_path: Path) -> None:
    _flip(pack / "tokens.bin", 100)
    out = tmp_path / "run" / "snapshots" / "step_0000002"
    cmd = [sys.executable, "-m", "pipeline_lib", "train", "--config",
           str(ROOT / "config" / "experiments" / "tiny.yaml"), "--data", str(pack),
           "--resume-from", "none", "--until-step", "2", "--out", str(out), "--no-track"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert f"{pack / 'tokens.bin'} does not match its sha256" in errors[0]
    assert not out.exists() and not list(out.parent.glob(f".{out.name}*"))
    assert not (tmp_path / "run" / "train" / "metrics.jsonl").exists()
