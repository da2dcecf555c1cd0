"""Fixture: one complete snapshot of a tiny real training state."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_helpers import make_state, snapshot_kwargs

from pipeline_lib.checkpoint.snapshot import write_snapshot


@pytest.fixture
def snapshot_dir(tmp_path: Path) -> Path:
    model, opt = make_state()
    return write_snapshot(tmp_path / "snapshots" / "step_0000003",
                          **snapshot_kwargs(model, opt, extra_files={"metrics.jsonl": "{}\n"}))
