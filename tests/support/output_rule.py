"""A tiny pack, snapshot and sweep made with the commands themselves, for the output-rule
tests (tests/reliability/test_rel_output_*.py), and the verdict they share."""

from __future__ import annotations

import errno
import hashlib
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pipeline_lib.cli import main
from support.rel_messages import write_yaml

SNAPSHOT = Path("run") / "snapshots" / "step_0000004"
SWEEP = Path("run") / "eval" / "heff" / "step_0000004.json"


def write_tiny_config(path: Path, **sections: dict) -> Path:
    """The config of the CLI reliability tests (pack and a four-step segment take about a
    second each), with ``sections`` replacing whole top-level sections."""
    return write_yaml(path, {
        "data": {"sources": [{"type": "reasoning", "num_docs": 60, "max_difficulty": 2}],
                 "seq_len": 16, "epochs": 1, "val_fraction": 0.5, "curriculum_fraction": 0},
        "model": {"d_model": 16, "n_heads": 2, "loops": 1},
        "train": {"total_steps": 4, "steps_per_segment": 4, "global_batch_rows": 8,
                  "micro_batch_rows": 8, "eval_interval": 0, "diagnostics_interval": 0,
                  "sample_tokens": 0, "warmup_steps": 2, "objective": "last"},
        "eval": {"h_eff": [1]}, "runs": {}, **sections})


def build_ready(root: Path) -> Path:
    """``root`` with c.yaml, data/ (a pack), run/snapshots/step_0000004 (four steps),
    its sweep (SWEEP), a user's notes.yaml and README.md; no tracking."""
    cfg = write_tiny_config(root / "c.yaml", eval={"h_eff": [1, 2]},
                            bench={"tasks": ["loopline_parity"], "h_eff": [1]},
                            tracking={"enabled": False})
    for argv in (["pack", "--config", cfg, "--out", root / "data"],
                 ["train", "--config", cfg, "--data", root / "data", "--resume-from", "none",
                  "--until-step", "4", "--out", root / SNAPSHOT, "--no-track"],
                 ["heff", "--snapshot", root / SNAPSHOT, "--data", root / "data", "--out",
                  root / SWEEP, "--no-track"]):
        assert main([str(a) for a in argv]) == 0
    (root / "notes.yaml").write_text("a user's file: keep\n")
    (root / "README.md").write_text("# r\n<!-- results:begin -->\n<!-- results:end -->\n")
    return root


def hashes(root: Path) -> dict[str, str]:
    """sha256 of every file below ``root`` (what must not change), hidden ones included."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def refused(argv: list, capsys: pytest.CaptureFixture, *fragments: str) -> str:
    """``main(argv)`` exits 2 with one ``error:`` line holding every fragment and no
    traceback (an exception escaping ``main`` fails the test); returns the line."""
    rc = main([str(a) for a in argv])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert rc == 2, (argv, captured.err[-2000:])
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err + captured.out
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@contextmanager
def small_disk(path: Path, free_kib: int = 0) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted at ``path`` and filled until ``free_kib`` KiB are left (0: to
    the last block, ENOSPC), or a skip that prints why none can be mounted here."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}"
        print(reason)
        pytest.skip(reason)
    try:
        with open(path / "filler", "wb", buffering=0) as fh:
            try:
                for _ in range(64 - free_kib):
                    fh.write(b"\0" * 1024)
                while not free_kib:
                    fh.write(b"\0" * 1024)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC and not free_kib, exc
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
