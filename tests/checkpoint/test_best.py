"""snapshots/best tracks the lowest validation loss, atomically, as hard links."""

from __future__ import annotations

import json

from ckpt_helpers import make_state, snapshot_kwargs

from pipeline_lib.checkpoint.best import BEST_DIR, read_best, update_best_snapshot
from pipeline_lib.checkpoint.manifest import verify_snapshot
from pipeline_lib.checkpoint.restore import load_snapshot
from pipeline_lib.checkpoint.snapshot import write_snapshot


def _snap(root, step: int):
    model, opt = make_state(seed=step, steps=1)
    kwargs = snapshot_kwargs(model, opt)
    kwargs["trainer_state"] = {"step": step}
    return write_snapshot(root / f"step_{step:07d}", **kwargs)


def test_best_follows_lowest_loss_and_survives_deletion(tmp_path):
    s1, s2, s3 = _snap(tmp_path, 10), _snap(tmp_path, 20), _snap(tmp_path, 30)
    assert read_best(tmp_path) is None
    assert update_best_snapshot(tmp_path, s1, 3.0) is True
    assert read_best(tmp_path) == {"step": 10, "source": "step_0000010", "val_loss": 3.0}
    assert update_best_snapshot(tmp_path, s2, 3.0) is False  # a tie keeps the earlier one
    assert update_best_snapshot(tmp_path, s2, float("nan")) is False
    assert update_best_snapshot(tmp_path, s2, None) is False
    assert update_best_snapshot(tmp_path, s2, 2.5) is True
    assert update_best_snapshot(tmp_path, s3, 2.9) is False
    best = tmp_path / BEST_DIR
    verify_snapshot(best)
    assert read_best(tmp_path)["step"] == 20
    assert (best / "model.safetensors").stat().st_ino == (s2 / "model.safetensors").stat().st_ino
    expected = (s2 / "model.safetensors").read_bytes()
    for d in (s1, s2):  # rotation deletes the step directories
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    snap = load_snapshot(best)
    assert snap.trainer_state["step"] == 20 and json.loads(snap.extra_files["BEST.json"])["val_loss"] == 2.5
    assert (best / "model.safetensors").read_bytes() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best", "step_0000030"]


def test_damaged_best_is_rebuilt(tmp_path):
    s1, s2 = _snap(tmp_path, 1), _snap(tmp_path, 2)
    update_best_snapshot(tmp_path, s1, 1.0)
    (tmp_path / BEST_DIR / "BEST.json").write_text('{"val_loss": 0.0}')  # size mismatch
    assert read_best(tmp_path) is None
    assert update_best_snapshot(tmp_path, s2, 5.0) is True
    assert read_best(tmp_path)["source"] == "step_0000002"


def test_a_new_training_history_replaces_an_older_best(tmp_path):
    s1, s2 = _snap(tmp_path, 10), _snap(tmp_path, 20)
    assert update_best_snapshot(tmp_path, s2, 1.0) is True  # an earlier training's record
    assert update_best_snapshot(tmp_path, s1, 4.0) is False
    assert update_best_snapshot(tmp_path, s1, 4.0, new_history=True) is True
    assert read_best(tmp_path) == {"step": 10, "source": "step_0000010", "val_loss": 4.0}
    assert update_best_snapshot(tmp_path, s2, None, new_history=True) is False
