"""Two processes (torchrun, gloo on the CPU) against one: same rows, same losses, resumes
across world sizes, bit-identical 2→2 resume, sharded snapshots read without a group.

Runs shared by the tests (module fixture), all from one 1-process snapshot at step 2:

- ``two_a``: 2 processes 2→4 (resumes an unsharded snapshot: 1→2), ``two_b``: 2 processes
  4→6 from ``two_a`` (2→2), ``two_c``: 2 processes 2→6 in one segment;
- ``one``: 1 process 2→4→6 (the reference), ``back``: 1 process 4→6 from ``two_a`` (2→1).

Further jobs: a warm start with a NaN on rank 1 only (the skip is agreed), a failing job
(one error line), and 4 ranks resuming the 2-rank snapshot (DCP resharding). Each torchrun
job binds its own free port (``--standalone``: localhost:0).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from trainer_helpers import RICH, make_pack, metrics, snap, tiny_config

from pipeline_lib.checkpoint.manifest import verify_snapshot
from pipeline_lib.checkpoint.restore import load_model_state, load_snapshot
from pipeline_lib.checkpoint.snapshot import write_snapshot
from pipeline_lib.errors import CheckpointError, TrainingError
from pipeline_lib.evaluate.heff import run_heff
from pipeline_lib.spec.data_id import data_id
from pipeline_lib.train.job import train_segment
from pipeline_lib.train.launch import run_training_job

pytestmark = pytest.mark.slow

# MoE, sampled loop counts, unrolled backprop, EMA and a replicated scalar λ: every part
# of the state that has to cross between world sizes.
CFG = tiny_config(*RICH)
CFG2 = replace(CFG, train=replace(CFG.train, nproc=2))
STEPS = (3, 4, 5, 6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dist")
    pack = make_pack(root / "data" / data_id(CFG.data))
    start = train_segment(CFG, pack, None, 2, snap(root / "start", 2))
    r = {"root": root, "pack": pack, "start": start}
    for name in ("one", "two_a", "two_b", "two_c", "back"):
        r[name] = root / name
    run_training_job(CFG2, pack, start, 4, snap(r["two_a"], 4), r["two_a"])
    run_training_job(CFG2, pack, snap(r["two_a"], 4), 6, snap(r["two_b"], 6), r["two_b"])
    run_training_job(CFG2, pack, start, 6, snap(r["two_c"], 6), r["two_c"])
    train_segment(CFG, pack, start, 4, snap(r["one"], 4))
    train_segment(CFG, pack, snap(r["one"], 4), 6, snap(r["one"], 6))
    train_segment(CFG, pack, snap(r["two_a"], 4), 6, snap(r["back"], 6))
    return r


def by_step(run: Path) -> dict[int, dict]:
    return {m["step"]: m for m in metrics(run)}


def close(a: dict, b: dict, keys=("loss", "aux_loss", "grad_norm")) -> None:
    for key in keys:
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)


def test_two_processes_read_the_same_rows_and_match_one(runs: dict[str, Path]) -> None:
    one, two = by_step(runs["one"]), {**by_step(runs["two_a"]), **by_step(runs["two_b"])}
    assert sorted(two) == list(STEPS)
    for step in STEPS:
        assert two[step]["cursor"] == one[step]["cursor"] == [0, 8 * (step - 1)]
        assert two[step]["loops"] == one[step]["loops"]
        assert two[step]["tokens_seen"] == one[step]["tokens_seen"] == step * 8 * 32
        close(two[step], one[step])
        assert len(two[step]["unroll_losses"]) == len(one[step]["unroll_losses"])
    for step in (4, 6):  # validation of the same weights on every rank
        assert two[step]["val_loss"] == pytest.approx(one[step]["val_loss"], rel=1e-5)
    # the MoE loads are averaged over ranks: fractions of one expert set summing to 1
    loads = [v for k, v in two[4].items() if k.startswith("moe_load/core.0/e")]
    assert len(loads) == 4 and sum(loads) == pytest.approx(1.0, abs=1e-6)
    assert [s["prompt"] for s in map(json.loads, (snap(runs["two_a"], 4) / "samples.jsonl")
                                      .read_text().splitlines())] == list(CFG.train.sample_prompts)


def test_two_to_two_resume_is_bit_identical(runs: dict[str, Path]) -> None:
    split, whole = by_step(runs["two_b"]), by_step(runs["two_c"])
    for step in (5, 6):
        for key in ("loss", "grad_norm", "aux_loss", "cursor", "loops", "unroll_losses"):
            assert split[step][key] == whole[step][key], (step, key)
    a, b = load_snapshot(snap(runs["two_b"], 6)), load_snapshot(snap(runs["two_c"], 6))
    for which in ("model_state",):
        sa, sb = getattr(a, which), getattr(b, which)
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert all(torch.equal(a.extra_tensors["ema"][k], b.extra_tensors["ema"][k])
               for k in a.extra_tensors["ema"])
    for i, state in a.optimizer_state["state"].items():
        assert all(torch.equal(v, b.optimizer_state["state"][i][n]) for n, v in state.items())
    sa, sb = a.trainer_state, b.trainer_state
    assert sa["cursor"] == sb["cursor"] == [0, 48]
    assert sa["spike_guard"] == sb["spike_guard"] and sa["moe_biases"] == sb["moe_biases"]


def test_sharded_snapshot_layout_and_rank_rng(runs: dict[str, Path]) -> None:
    path = snap(runs["two_a"], 4)
    files = verify_snapshot(path)["files"]
    assert not (path / "model.safetensors").exists()
    for d in ("model_dcp", "optimizer_dcp", "ema_dcp"):
        assert sum(n.startswith(f"{d}/") for n in files) == 2  # one shard file per rank
    assert {"rng_rank0.json", "rng_rank1.json", "rng_rank0.safetensors"} <= set(files)
    assert (path / "tokenizer.json").read_bytes() == (runs["pack"] / "tokenizer.json").read_bytes()
    assert "tokenizer.json" in files  # self-contained, sharded too
    assert json.loads((path / "trainer_state.json").read_text())["world_size"] == 2
    assert not any(n.endswith(".metadata") for n in files)  # no pickle file anywhere
    r0, r1 = load_snapshot(path, rank=0).rng_state, load_snapshot(path, rank=1).rng_state
    r5 = load_snapshot(path, rank=5).rng_state  # a rank the writer did not have: rank 0's
    assert torch.equal(r5["torch_cpu"], r0["torch_cpu"])
    assert r0["python"] == r1["python"]  # nothing in training draws from python's RNG


def test_two_to_one_resume(runs: dict[str, Path]) -> None:
    back, one = by_step(runs["back"]), by_step(runs["one"])
    assert sorted(back) == [5, 6]
    for step in (5, 6):
        assert back[step]["cursor"] == one[step]["cursor"]
        close(back[step], one[step])
    out = snap(runs["back"], 6)
    assert (out / "model.safetensors").is_file()  # one process writes an unsharded snapshot
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["cursor"] == [0, 48]
    assert [s["end_step"] for s in state["segments"]] == [2, 4, 6]


def test_sharded_snapshot_heff_equals_its_unsharded_copy(runs: dict[str, Path]) -> None:
    sharded = snap(runs["two_a"], 4)
    full = load_snapshot(sharded)  # consolidated in this process: no process group
    weights = load_model_state(sharded)
    assert weights.keys() == full.model_state.keys()
    assert all(torch.equal(weights[k], full.model_state[k]) for k in weights)
    copy = write_snapshot(
        runs["root"] / "copy" / "snapshots" / "step_0000004", model_state=full.model_state,
        optimizer_state=full.optimizer_state, trainer_state=full.trainer_state,
        rng_state=full.rng_state, config_yaml=full.config_yaml,
        extra_tensors=full.extra_tensors, extra_files=full.extra_files)
    h = [1, 2, 4]
    a = run_heff(sharded, runs["pack"], h, runs["root"] / "heff_a.json", max_tokens=10_000,
                 batch_rows=4)
    b = run_heff(copy, runs["pack"], h, runs["root"] / "heff_b.json", max_tokens=10_000,
                 batch_rows=4)
    assert a == b and a["step"] == 4 and a["tokens"] > 300
    ema = load_model_state(sharded, which="ema")
    assert all(torch.equal(ema[k], full.extra_tensors["ema"][k]) for k in ema)


def test_damaged_shard_is_refused_naming_the_file(runs: dict[str, Path], tmp_path: Path) -> None:
    path = shutil.copytree(snap(runs["two_b"], 6), tmp_path / "step_0000006")
    shard = sorted((path / "model_dcp").iterdir())[1]
    blob = bytearray(shard.read_bytes())
    blob[-3] ^= 0xFF
    shard.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=f"model_dcp/{shard.name} fails its sha256"):
        load_model_state(path)
    (path / "model_dcp" / "stray.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="model_dcp/stray.safetensors"):
        verify_snapshot(path, hash_files=())


def test_a_rank_error_surfaces_as_one_line(runs: dict[str, Path]) -> None:
    with pytest.raises(TrainingError, match=r"failed: rank [01]: --until-step 99 exceeds"):
        run_training_job(CFG2, runs["pack"], runs["start"], 99, snap(runs["root"] / "bad", 99))


def test_warm_start_and_a_nan_on_one_rank_skip_on_every_rank(
        runs: dict[str, Path], inject_faults) -> None:
    """2 processes warm-start from the 1-process snapshot; at step 2 only rank 1's loss is
    NaN: the averaged statistics make both ranks skip (otherwise the replicas diverge and
    the agreement check fails); the run matches 1 process with a NaN at step 2."""
    pack, start, root = runs["pack"], runs["start"], runs["root"]
    inject_faults("nan_step=2")
    train_segment(CFG, pack, None, 3, snap(root / "warm1", 3), warm_start=start)
    inject_faults("nan_step=2,nan_rank=1")  # the torchrun workers install it themselves
    run_training_job(CFG2, pack, None, 3, snap(root / "warm2", 3), warm_start=start)
    one, two = by_step(root / "warm1"), by_step(root / "warm2")
    assert [two[s]["skipped"] for s in (1, 2, 3)] == [False, True, False]
    assert two[2]["skip_reason"] == one[2]["skip_reason"]
    for step in (1, 3):
        close(two[step], one[step])
    state = json.loads((snap(root / "warm2", 3) / "trainer_state.json").read_text())
    assert state["warm_start"]["warm_start_from"] == str(start.resolve())
    assert state["spike_guard"]["skipped_total"] == 1


def test_two_to_four_reshards_the_dcp_snapshot(runs: dict[str, Path]) -> None:
    """4 ranks (uneven shards of the vocabulary rows) resume the 2-rank snapshot through DCP
    resharding; with the same rows per micro-batch (2) one process computes the same steps.
    (The loss is a mean of micro-batch means, so a run compares exactly only with runs of the
    same micro-batch size.)"""
    root, pack = runs["root"], runs["pack"]
    four = replace(CFG, train=replace(CFG.train, nproc=4, micro_batch_rows=2))
    run_training_job(four, pack, snap(runs["two_a"], 4), 6, snap(root / "four", 6))
    one = replace(CFG, train=replace(CFG.train, micro_batch_rows=2))
    train_segment(one, pack, snap(runs["one"], 4), 6, snap(root / "one_m2", 6))
    a, b = by_step(root / "four"), by_step(root / "one_m2")
    for step in (5, 6):
        assert a[step]["cursor"] == b[step]["cursor"]
        close(a[step], b[step])
    assert a[6]["val_loss"] == pytest.approx(b[6]["val_loss"], rel=1e-5)
    files = verify_snapshot(snap(root / "four", 6))["files"]
    assert sum(n.startswith("model_dcp/") for n in files) == 4


def test_frozen_parts_stay_fixed_under_fsdp(tmp_path: Path) -> None:
    """train.freeze with FSDP2: a whole frozen block (coda), the embedding and the replicated
    scalar λ (the adapter) keep their initial values on two ranks, the rest trains."""
    from pipeline_lib.train.trainer import Trainer

    cfg = tiny_config(*RICH, "model.coda_layers=1", "train.freeze=[embeddings,adapter,coda]")
    pack = make_pack(tmp_path / "data" / data_id(cfg.data))
    out = run_training_job(replace(cfg, train=replace(cfg.train, nproc=2)), pack, None, 2,
                           snap(tmp_path / "two", 2), tmp_path / "two")
    initial = Trainer.build(cfg, pack).model.state_dict()
    for name, value in load_model_state(out).items():
        fixed = name.startswith(("coda.", "tok_emb.", "injection_scale"))
        assert torch.equal(value, initial[name]) == fixed, name


def test_activation_checkpointing_under_fsdp_is_bit_identical(runs: dict[str, Path]) -> None:
    """2 processes 2→6 with block checkpointing (FSDP2 all-gathers each block again for
    its recomputation) against ``two_c``: the same losses, norms, MoE biases and weights."""
    cfg = replace(CFG2, train=replace(CFG2.train, activation_checkpointing="block"))
    out = runs["root"] / "ckpt"
    run_training_job(cfg, runs["pack"], runs["start"], 6, snap(out, 6), out)
    got, whole = by_step(out), by_step(runs["two_c"])
    for step in STEPS:
        for key in ("loss", "grad_norm", "aux_loss", "unroll_losses", "val_loss"):
            assert got[step].get(key) == whole[step].get(key), (step, key)
    a, b = load_snapshot(snap(out, 6)), load_snapshot(snap(runs["two_c"], 6))
    assert all(torch.equal(a.model_state[k], b.model_state[k]) for k in b.model_state)
    assert a.trainer_state["moe_biases"] == b.trainer_state["moe_biases"]
