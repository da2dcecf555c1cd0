"""Atomic text writes and file hashes shared by every layer."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pipeline_lib.fsio import file_sha256, write_text_atomic


@pytest.mark.parametrize("fsync", [False, True])
def test_write_replaces_the_file_and_leaves_no_sibling(tmp_path: Path, fsync: bool) -> None:
    path = tmp_path / "doc.json"
    path.write_text("old\n")
    assert write_text_atomic(path, "new\n", fsync=fsync) is True
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]


def test_if_changed_leaves_an_identical_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "task.yaml"
    write_text_atomic(path, "a: 1\n")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert write_text_atomic(path, "a: 1\n", if_changed=True) is False
    assert path.stat().st_mtime_ns == 1_000_000_000
    assert write_text_atomic(path, "a: 2\n", if_changed=True) is True
    assert path.read_text() == "a: 2\n"


def test_a_failed_write_keeps_the_old_file_and_no_sibling(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text("kept\n")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "\udcff")  # a lone surrogate cannot be encoded
    assert path.read_text() == "kept\n"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_file_sha256_matches_hashlib_across_chunks(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 9000  # > 2 MiB: several read chunks
    path = tmp_path / "blob.bin"
    path.write_bytes(blob)
    assert file_sha256(path) == hashlib.sha256(blob).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert file_sha256(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()
