"""Snapshot round trip (bit-exact continuation), replacement rules, and SIGKILL during write."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from ckpt_helpers import TinyLM, make_optimizer, make_state, snapshot_kwargs, train_steps
from support.faults import SNAPSHOT_PAUSE_ENV

from pipeline_lib.checkpoint.manifest import MANIFEST_NAME, verify_snapshot
from pipeline_lib.checkpoint.restore import load_model_state, load_snapshot, load_weights_only
from pipeline_lib.checkpoint.rng import capture_rng_state, restore_rng_state
from pipeline_lib.checkpoint.snapshot import write_snapshot
from pipeline_lib.errors import CheckpointError


def assert_tree_equal(a, b, path="") -> None:
    """Same structure, same Python types, bit-identical tensors."""
    assert type(a) is type(b), f"{path}: {type(a)} vs {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_tree_equal(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_tree_equal(x, y, f"{path}/{i}")
    else:
        assert a == b, path


@pytest.mark.parametrize("kind", ["adamw", "adamatan2"])
def test_round_trip_is_bit_exact_and_training_continues_identically(tmp_path, kind):
    model, opt = make_state(seed=0, steps=3, kind=kind)
    ema = {k: v.clone() * 0.5 for k, v in model.state_dict().items() if v.is_floating_point()}
    out = write_snapshot(tmp_path / "step_0000003", **snapshot_kwargs(
        model, opt, extra_tensors={"ema": ema},
        extra_files={"metrics.jsonl": '{"step": 1}\n', "samples.jsonl": b"\x00bin"}))
    assert out == tmp_path / "step_0000003"
    py_next, np_next = random.random(), np.random.rand()
    expected_losses = train_steps(model, opt, 4)
    expected_state = {k: v.clone() for k, v in model.state_dict().items()}

    # A fresh process-like start: other seeds, other RNG positions, fresh objects.
    torch.manual_seed(999)
    random.seed(5)
    np.random.seed(5)
    model2 = TinyLM()
    opt2 = make_optimizer(model2, kind)
    snap = load_snapshot(out)
    assert snap.trainer_state["step"] == 3 and snap.trainer_state["cursor"] == [0, 12]
    assert snap.config_yaml == "model:\n  d_model: 8\n"
    assert snap.extra_files == {"metrics.jsonl": b'{"step": 1}\n', "samples.jsonl": b"\x00bin"}
    assert_tree_equal(snap.extra_tensors["ema"], ema)
    assert snap.model_state["head.weight"] is snap.model_state["embed.weight"]
    model2.load_state_dict(snap.model_state)
    opt2.load_state_dict(snap.optimizer_state)
    restore_rng_state(snap.rng_state)
    assert (random.random(), np.random.rand()) == (py_next, np_next)
    losses = train_steps(model2, opt2, 4)
    assert losses == expected_losses
    assert_tree_equal(dict(model2.state_dict()), expected_state)
    assert_tree_equal(opt2.state_dict(), opt.state_dict())


def test_optimizer_state_comes_back_in_state_dict_form(tmp_path):
    model, opt = make_state(steps=2)
    snap = load_snapshot(write_snapshot(tmp_path / "s", **snapshot_kwargs(model, opt)))
    assert_tree_equal(snap.optimizer_state, opt.state_dict())
    assert isinstance(snap.optimizer_state["param_groups"][0]["betas"], tuple)
    assert all(t.device.type == "cpu" for s in snap.optimizer_state["state"].values()
               for t in s.values())


def test_load_model_state_reads_model_or_ema_only(tmp_path):
    model, opt = make_state()
    ema = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items()
           if v.is_floating_point()}
    out = write_snapshot(tmp_path / "s", **snapshot_kwargs(model, opt, extra_tensors={"ema": ema}))
    assert_tree_equal(load_model_state(out), dict(model.state_dict()))
    assert_tree_equal(load_model_state(out, which="ema"), ema)
    with pytest.raises(CheckpointError, match="no 'swa' weights .*ema"):
        load_model_state(out, which="swa")


def test_existing_valid_snapshot_is_replaced_whole(snapshot_dir):
    model, opt = make_state(seed=1, steps=1)
    kwargs = snapshot_kwargs(model, opt)
    kwargs["trainer_state"] = {"step": 99}
    write_snapshot(snapshot_dir, **kwargs)
    snap = load_snapshot(snapshot_dir)
    assert snap.trainer_state["step"] == 99 and "metrics.jsonl" not in snap.extra_files
    assert [p.name for p in snapshot_dir.parent.iterdir()] == [snapshot_dir.name]


def test_existing_invalid_directory_is_not_overwritten(tmp_path):
    target = tmp_path / "step_0000010"
    target.mkdir()
    (target / "precious.txt").write_text("user data")
    model, opt = make_state(steps=1)
    with pytest.raises(CheckpointError, match="already exists and is not a valid snapshot"):
        write_snapshot(target, **snapshot_kwargs(model, opt))
    assert (target / "precious.txt").read_text() == "user data"


def test_bad_inputs_are_refused_before_writing(tmp_path):
    model, opt = make_state(steps=1)
    with pytest.raises(CheckpointError, match="trainer state must be plain JSON"):
        write_snapshot(tmp_path / "a", **snapshot_kwargs(
            model, opt, trainer_state={"bias": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="not a str"):
        write_snapshot(tmp_path / "a", **snapshot_kwargs(model, opt, trainer_state={1: 2}))
    with pytest.raises(CheckpointError, match="'config.yaml' is reserved"):
        write_snapshot(tmp_path / "a", **snapshot_kwargs(
            model, opt, extra_files={"config.yaml": "x"}))
    for name in ("../x", "notes.txt\n"):  # $ of re.match passed a final newline
        with pytest.raises(CheckpointError, match="reserved or not a plain"):
            write_snapshot(tmp_path / "a", **snapshot_kwargs(model, opt,
                                                             extra_files={name: "x"}))
    assert list(tmp_path.iterdir()) == []


def _published(root) -> list[str]:
    """What a reader takes for snapshots: visible directories that hold a manifest."""
    return sorted(p.name for p in root.iterdir()
                  if not p.name.startswith(".") and (p / MANIFEST_NAME).is_file())


def test_stale_temporary_siblings_are_cleaned_and_never_listed(tmp_path):
    snapshots = tmp_path / "snapshots"
    stale = snapshots / ".step_0000005.tmp-otherhost-1-deadbeef"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"partial")
    unrelated = snapshots / ".step_0000009.tmp-otherhost-1-deadbeef"
    unrelated.mkdir()
    assert _published(snapshots) == []
    model, opt = make_state(steps=1)
    write_snapshot(snapshots / "step_0000005", **snapshot_kwargs(model, opt))
    assert not stale.exists() and unrelated.exists()
    assert _published(snapshots) == ["step_0000005"]


def test_capture_restore_rng_repeats_streams():
    state = capture_rng_state()
    first = (random.random(), np.random.rand(), torch.rand(3).tolist(), random.gauss(0, 1))
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(3).tolist(), random.gauss(0, 1)) == first
    with pytest.raises(CheckpointError, match="lacks"):
        restore_rng_state({"python": state["python"]})


_WRITER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])  # tests/, for the fault-injection support
    from support.faults import install_from_env
    from pipeline_lib.checkpoint.rng import capture_rng_state
    from pipeline_lib.checkpoint.snapshot import write_snapshot
    install_from_env()  # LOOPLINE_TEST_SNAPSHOT_PAUSE_S: a pause after each file
    torch.manual_seed(0)
    big = {"w%d" % i: torch.randn(256, 256) for i in range(8)}
    write_snapshot(sys.argv[1], model_state=big, optimizer_state={"state": {}, "param_groups": []},
                   trainer_state={"step": 7}, rng_state=capture_rng_state(), config_yaml="x: 1\\n",
                   extra_files={"metrics.jsonl": "{}\\n"})
""")


def _kill_mid_write(target) -> None:
    env = {**os.environ, SNAPSHOT_PAUSE_ENV: "60"}
    tests = Path(__file__).resolve().parents[1]
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), str(tests)], env=env,
                            stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:  # wait until the first file is on disk and the writer sleeps
            if "test hook: pausing" in line:
                break
        else:
            pytest.fail(f"writer exited early with {proc.wait()}")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_sigkill_during_replacement_keeps_old_snapshot(snapshot_dir):
    before = {p.name: p.read_bytes() for p in snapshot_dir.iterdir()}
    _kill_mid_write(snapshot_dir)
    leftovers = [p for p in snapshot_dir.parent.iterdir() if p != snapshot_dir]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".step_0000003.tmp-")
    assert (leftovers[0] / "model.safetensors").is_file()
    with pytest.raises(CheckpointError, match="incomplete"):
        verify_snapshot(leftovers[0])
    assert {p.name: p.read_bytes() for p in snapshot_dir.iterdir()} == before
    assert load_snapshot(snapshot_dir).trainer_state["step"] == 3
    # the next write cleans the leftover and replaces the snapshot
    model, opt = make_state(steps=1)
    write_snapshot(snapshot_dir, **snapshot_kwargs(model, opt))
    assert [p.name for p in snapshot_dir.parent.iterdir()] == [snapshot_dir.name]


@pytest.mark.slow
def test_sigkill_during_first_write_leaves_no_snapshot(tmp_path):
    target = tmp_path / "snapshots" / "step_0000007"
    _kill_mid_write(target)
    assert not target.exists()
    assert _published(target.parent) == []
    with pytest.raises(CheckpointError, match="does not exist"):
        load_snapshot(target)
    assert MANIFEST_NAME not in {p.name for d in target.parent.iterdir() for p in d.iterdir()}


def test_load_weights_only_copies_weights_and_nothing_else(tmp_path):
    model, opt = make_state(seed=0, steps=3)
    snap = write_snapshot(tmp_path / "step_0000003", **snapshot_kwargs(model, opt))
    torch.manual_seed(42)
    fresh = TinyLM()
    info = load_weights_only(snap, fresh)
    assert info == {"warm_start_from": str(snap), "step": 3, "weights": "model"}
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert fresh.head.weight is fresh.embed.weight  # tying survives


def test_load_weights_only_lists_misfits(tmp_path):
    model, opt = make_state(steps=1)
    snap = write_snapshot(tmp_path / "s", **snapshot_kwargs(model, opt))
    other = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with pytest.raises(CheckpointError, match=r"missing 0.weight; .*unexpected counter"):
        load_weights_only(snap, other)
    wider = TinyLM()
    wider.mix = torch.nn.Linear(8, 9)
    with pytest.raises(CheckpointError, match=r"mix.weight shape \(8, 8\) vs model \(9, 8\)"):
        load_weights_only(snap, wider, strict=False)
