"""verify_snapshot refuses incomplete, damaged and tampered snapshots, naming the file."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from pipeline_lib.checkpoint.manifest import MANIFEST_NAME, HashingWriter, verify_snapshot
from pipeline_lib.checkpoint.restore import load_snapshot
from pipeline_lib.errors import CheckpointError


def test_valid_snapshot_manifest_lists_every_file(snapshot_dir):
    manifest = verify_snapshot(snapshot_dir)
    on_disk = {p.name for p in snapshot_dir.iterdir()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == on_disk
    assert on_disk == {"model.safetensors", "optimizer.safetensors", "optimizer.json",
                       "rng.safetensors", "rng.json", "trainer_state.json", "config.yaml",
                       "metrics.jsonl"}
    for name, record in manifest["files"].items():
        assert record["size"] == (snapshot_dir / name).stat().st_size


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.json", "trainer_state.json",
                                  "rng.safetensors", "metrics.jsonl"])
def test_one_flipped_byte_is_refused_naming_the_file(snapshot_dir, name):
    path = snapshot_dir / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{name} fails its sha256 check"):
        verify_snapshot(snapshot_dir)
    with pytest.raises(CheckpointError, match=name):
        load_snapshot(snapshot_dir)


def test_missing_manifest_means_incomplete(snapshot_dir):
    (snapshot_dir / MANIFEST_NAME).unlink()
    with pytest.raises(CheckpointError, match="incomplete: MANIFEST.json is missing"):
        load_snapshot(snapshot_dir)


def test_missing_listed_file(snapshot_dir):
    (snapshot_dir / "rng.json").unlink()
    with pytest.raises(CheckpointError, match="missing rng.json"):
        verify_snapshot(snapshot_dir)


def test_truncated_file_is_a_size_mismatch(snapshot_dir):
    path = snapshot_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CheckpointError, match=r"model.safetensors has \d+ bytes but"):
        verify_snapshot(snapshot_dir, hash_files=())


def test_unexpected_extra_file_is_refused(snapshot_dir):
    (snapshot_dir / "notes.txt").write_text("hi")
    with pytest.raises(CheckpointError, match="holds notes.txt"):
        verify_snapshot(snapshot_dir)


def test_malformed_or_foreign_manifest(snapshot_dir):
    mpath = snapshot_dir / MANIFEST_NAME
    doc = json.loads(mpath.read_text())
    mpath.write_text("{not json")
    with pytest.raises(CheckpointError, match="MANIFEST.json is unreadable"):
        verify_snapshot(snapshot_dir)
    mpath.write_text(json.dumps({**doc, "version": 99}))
    with pytest.raises(CheckpointError, match="format version 99"):
        verify_snapshot(snapshot_dir)
    mpath.write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not a loopline-snapshot manifest"):
        verify_snapshot(snapshot_dir)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        verify_snapshot(tmp_path / "nope")


@pytest.mark.parametrize("sizes", [
    [10, 3 << 20, 7, 1 << 20, 5, 5, 20 << 20, 0, 9],      # small writes between large ones
    [(1 << 20) - 1] * 12,                                # small ones filling several batches
    [100, 200],                                          # small only: hashed inline
    [17 << 20],                                          # one large write, several chunks
])
def test_hashing_writer_record_matches_the_file(tmp_path, sizes):
    rng = np.random.default_rng(0)
    path = tmp_path / "f.bin"
    with open(path, "wb") as fh:
        writer = HashingWriter(fh)
        for n in sizes:
            writer.write(rng.integers(0, 256, n, dtype=np.uint8).data)
    data = path.read_bytes()
    assert len(data) == sum(sizes)
    assert writer.record("x") == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                  "role": "x"}
