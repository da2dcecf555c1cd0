"""Directory publication: fresh rename, atomic swap, fallback swap, stale sibling cleanup."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from pipeline_lib.checkpoint import fsutil


def _dir(path, content: str):
    path.mkdir(parents=True)
    (path / "f").write_text(content)
    return path


def test_publish_new_target(tmp_path):
    tmp = _dir(fsutil.tmp_sibling(tmp_path / "t"), "new")
    fsutil.publish_dir(tmp, tmp_path / "t")
    assert (tmp_path / "t" / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["t"]


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "fallback"])
def test_publish_replaces_existing_target(tmp_path, monkeypatch, exchange):
    target = _dir(tmp_path / "t", "old")
    if not exchange:
        monkeypatch.setattr(fsutil, "_rename_exchange", lambda a, b: False)
    tmp = _dir(fsutil.tmp_sibling(target), "new")
    fsutil.publish_dir(tmp, target)
    assert (target / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["t"]


def test_rename_exchange_swaps_when_supported(tmp_path):
    a, b = _dir(tmp_path / "a", "A"), _dir(tmp_path / "b", "B")
    if not fsutil._rename_exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) unsupported on this filesystem")
    assert (a / "f").read_text() == "B" and (b / "f").read_text() == "A"


def test_clean_stale_siblings_spares_live_writers(tmp_path):
    target = tmp_path / "step_0000001"
    host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    live = os.getppid()  # pytest's parent shell: alive and not us
    names = [f".step_0000001.tmp-{host}-{dead}-aa", f".step_0000001.old-{host}-{dead}-bb",
             f".step_0000001.tmp-{host}-{live}-cc", f".step_0000001.tmp-other-{live}-dd",
             f".step_0000001.tmp-{host}-{os.getpid()}-ee", ".step_0000002.tmp-x-1-ff"]
    for n in names:
        (tmp_path / n).mkdir()
    removed = {p.name for p in fsutil.clean_stale_siblings(target)}
    assert removed == {names[0], names[1], names[3], names[4]}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names[2], names[5]])
