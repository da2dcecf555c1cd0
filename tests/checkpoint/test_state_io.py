"""The one checkpoint path: parts by name into files, back into the parts (one process)."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline_lib.checkpoint import state_io
from pipeline_lib.checkpoint.restore import restore_snapshot
from pipeline_lib.checkpoint.rng import RNGStreams
from pipeline_lib.errors import CheckpointError


class Box:
    """A minimal Stateful holding whatever it is given."""

    def __init__(self, state, optional=False):
        self.state, self.loaded, self.optional = state, None, optional

    def state_dict(self):
        return self.state

    def load_state_dict(self, state):
        self.loaded = state


def parts(**extra):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    rng = RNGStreams()
    rng.capture()
    return {"config": Box({"yaml": "a: 1\n"}), "model": Box(model.state_dict()),
            "optimizer": Box(opt.state_dict()), "rng": rng,
            "trainer": Box({"format": 1, "step": 7}), **extra}


def test_parts_land_in_their_files_and_come_back(tmp_path):
    ema = {"weight": torch.full((2, 3), 0.5), "bias": torch.zeros(2)}
    saved = parts(guard=Box({"baselines": {"0": 1.5}}), ema=Box({**ema, "updates": 4}))
    out = state_io.save(tmp_path / "s", saved, files={"notes.txt": "hi"})
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "optimizer.safetensors", "optimizer.json", "rng.json",
            "ema.safetensors", "trainer_state.json", "config.yaml", "notes.txt"} <= names
    doc = json.loads((out / "trainer_state.json").read_text())
    assert doc["step"] == 7 and doc["guard"] == {"baselines": {"0": 1.5}}
    assert doc["ema"] == {"updates": 4}  # the EMA's non-tensor entries: a JSON section
    fresh = parts(guard=Box(None), ema=Box(None))
    fresh["rng"] = Box(None)
    snap = restore_snapshot(out, fresh)
    assert fresh["config"].loaded == {"yaml": "a: 1\n"}
    assert fresh["guard"].loaded == {"baselines": {"0": 1.5}}
    assert fresh["trainer"].loaded == {"format": 1, "step": 7}  # no sections in it
    assert fresh["ema"].loaded["updates"] == 4
    assert torch.equal(fresh["ema"].loaded["weight"], ema["weight"])
    assert all(torch.equal(fresh["model"].loaded[k], v) for k, v in saved["model"].state.items())
    assert torch.equal(fresh["rng"].loaded["torch_cpu"], saved["rng"].state_dict()["torch_cpu"])
    assert snap.extra_files["notes.txt"] == b"hi"


def test_absent_part_refuses_unless_optional(tmp_path):
    out = state_io.save(tmp_path / "s", parts())
    with pytest.raises(CheckpointError, match="holds no 'guard' state"):
        restore_snapshot(out, parts(guard=Box(None)))
    optional = Box(None, optional=True)
    restore_snapshot(out, parts(ema=optional))
    assert optional.loaded is None  # left to start fresh


def test_a_part_may_not_shadow_a_trainer_key(tmp_path):
    with pytest.raises(CheckpointError, match="collides"):
        state_io.save(tmp_path / "s", parts(step=Box({"x": 1})))
    assert not (tmp_path / "s").exists()


def test_required_parts_and_uncaptured_rng(tmp_path):
    given = parts()
    del given["optimizer"]
    with pytest.raises(CheckpointError, match="optimizer"):
        state_io.save(tmp_path / "s", given)
    with pytest.raises(CheckpointError, match="not captured"):
        state_io.save(tmp_path / "s", {**parts(), "rng": RNGStreams()})
    assert not (tmp_path / "s").exists()
