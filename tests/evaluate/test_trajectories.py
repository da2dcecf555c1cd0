"""Latent trajectories: the measures against a direct computation, one run of the loops per
batch, the path classes on hand-made paths, the PCA, and the written result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline_lib.data.loader import PackedData
from pipeline_lib.errors import UsageError
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.evaluate.trajectories import (
    record,
    record_batch,
    run_trajectories,
    sampled_batches,
)
from pipeline_lib.evaluate.trajectory_paths import (
    CONVERGED_STEP,
    classify_paths,
    path_measures,
    pca_2d,
    per_loop_summary,
)


@pytest.fixture(scope="module")
def loaded(tiny_run):
    data_dir, snap = tiny_run
    return load_for_eval(snap, with_tokenizer=False), PackedData(data_dir)


def _direct(model, data, row: int, pos: int, loops: int) -> tuple[list, list, list]:
    """Relative step, cosine and KL(p_t ‖ p_M) of one token, each loop count in a pass of
    its own over its row alone (float64 numpy formulas)."""
    batch = data.val_batch(np.array([row]))
    states, logp = [], []
    with torch.no_grad():
        ctx = model.embed(batch)
        states.append(model.init_state(ctx)[0, pos].double().numpy())
        for t in range(1, loops + 1):
            ctx = model.embed(batch)
            state = model.forward_loops(ctx, 0, t)
            states.append(state[0, pos].double().numpy())
            logits = model.logits_at(batch, t)[0, pos].double()
            logp.append(torch.log_softmax(logits, dim=-1).numpy())
    rel, cos, kl = [], [], []
    for t in range(1, loops + 1):
        now, before = states[t], states[t - 1]
        rel.append(np.linalg.norm(now - before) / np.linalg.norm(now))
        both = np.linalg.norm(now) * np.linalg.norm(before)
        cos.append(float(now @ before / both) if both > 0 else 0.0)
        kl.append(float(np.sum(np.exp(logp[t - 1]) * (logp[t - 1] - logp[-1]))))
    return rel, cos, kl


def test_measures_equal_a_direct_computation(loaded) -> None:
    (model, data), loops = (loaded[0].model, loaded[1]), 5
    rec = record(model, data, tokens=12, max_loops=loops, batch_rows=3,
                 device=torch.device("cpu"))
    assert rec.states.shape[:2] == (12, loops + 1) and rec.kl.shape == (12, loops)
    measures = path_measures(rec.states)
    for i, (row, pos, tok) in enumerate(zip(rec.rows, rec.positions, rec.token_ids,
                                            strict=True)):
        assert int(data.val_batch(np.array([row]))["input_ids"][0, pos]) == tok
        rel, cos, kl = _direct(model, data, row, pos, loops)
        assert measures["relative_step"][i].tolist() == pytest.approx(rel, rel=1e-5)
        assert measures["cosine"][i].tolist() == pytest.approx(cos, abs=1e-6)
        assert rec.kl[i].tolist() == pytest.approx(kl, rel=1e-3, abs=1e-6)  # fp32 readout
    assert rec.kl[:, -1].abs().max() == 0  # the final readout against itself


def test_the_loops_run_once_per_batch(loaded, monkeypatch) -> None:
    model, data = loaded[0].model, loaded[1]
    calls = []
    real = model._loop
    monkeypatch.setattr(model, "_loop", lambda state, ctx, t: calls.append(t) or
                        real(state, ctx, t))
    batches = len(list(sampled_batches(data, 10, 2)))
    record(model, data, tokens=10, max_loops=6, batch_rows=2, device=torch.device("cpu"))
    assert batches >= 2 and calls == list(range(6)) * batches


def test_the_sample_is_seeded_and_does_not_depend_on_the_batch_size(loaded) -> None:
    data = loaded[1]

    def picks(batch_rows: int, seed: int = 0) -> list[tuple[int, int]]:
        out = []
        for batch, rows, flat in sampled_batches(data, 30, batch_rows, seed):
            length = batch["input_ids"].shape[1]
            out += [(int(rows[f // length]), int(f % length)) for f in flat]
        return out

    assert len(picks(4)) == 30 and picks(4) == picks(7)
    assert picks(4, seed=1) != picks(4)
    assert len({row for row, _ in picks(4)}) >= 30 // 4  # spread over rows


def test_paths_need_only_the_input_tokens_not_what_targets_mean(loaded) -> None:
    """A labelled pack's targets are labels of the input tokens, not next tokens: the paths
    do not read them (the targets only say which positions may be sampled)."""
    model, data = loaded[0].model, loaded[1]
    batch = data.val_batch(np.arange(3))
    labels = torch.full_like(batch["targets"], -100)
    labels[:, 5::7] = (batch["input_ids"][:, 5::7] * 7 + 3) % model.cfg.vocab_size
    rows = torch.tensor([5, 12, 40, 70])
    want = record_batch(model, batch, rows, 3)
    for targets in (labels, None):
        other = {k: v for k, v in batch.items() if k != "targets"}
        if targets is not None:
            other["targets"] = targets
        got = record_batch(model, other, rows, 3)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _paths(*paths: list) -> torch.Tensor:
    return torch.tensor(np.array(paths), dtype=torch.float64)


def test_hand_made_paths_get_their_class() -> None:
    loops = 8
    t = np.arange(loops + 1)
    centre = np.array([5.0, -3.0, 2.0])
    geometric = 0.2 * centre + np.outer(0.6 ** t, [10.0, 20.0, -10.0])  # contracts, unsettled
    settled = np.vstack([np.zeros(3), np.tile(centre, (loops, 1))])  # settles after loop 1
    angle = 2 * math.pi * t / 5  # a cycle of period 5 around a far centre
    circle = centre * 10 + 3 * np.stack([np.cos(angle), np.sin(angle), np.zeros_like(angle)], 1)
    flip = np.where(t[:, None] % 2 == 0, [1.0, 1.0, 0.0], [-1.0, 1.0, 0.0])  # 2-cycle
    line = np.outer(t, [0.3, -0.2, 0.5])  # keeps moving away from s_0 at constant speed
    spiral_out = np.stack([t * np.cos(t / 3), t * np.sin(t / 3), t], 1)
    classes = classify_paths(_paths(geometric, settled, circle, flip, line, spiral_out))
    assert classes == ["converging", "converging", "orbiting", "orbiting", "drifting",
                       "drifting"]
    relative = path_measures(_paths(geometric))["relative_step"][0]
    assert relative[-1] > CONVERGED_STEP  # converging by contraction, not by the threshold


def test_a_slowing_orbit_stays_orbiting_and_one_small_step_is_not_settling() -> None:
    loops = 6
    states = np.array([[1.0, 0], [0, 1], [-1, 0], [0, -1], [1, 0], [0.0, 1], [0.0, 1.0001]])
    assert len(states) == loops + 1
    assert classify_paths(_paths(states)) == ["orbiting"]


def test_pca_keeps_the_geometry_of_paths_in_a_plane() -> None:
    gen = torch.Generator().manual_seed(0)
    plane = torch.randn(4, 7, 2, generator=gen, dtype=torch.float64)
    basis, _ = torch.linalg.qr(torch.randn(6, 2, generator=gen, dtype=torch.float64))
    states = plane @ basis.T + 3.0  # [4 tokens, 7 states, D = 6], offset from the origin
    projected, explained = pca_2d(states)
    assert projected.shape == (4, 7, 2)
    assert sum(explained) == pytest.approx(1.0) and explained[0] >= explained[1]
    flat, proj = states.reshape(-1, 6), projected.reshape(-1, 2)
    exact = "donot_use_mm_for_euclid_dist"
    assert torch.cdist(proj, proj, compute_mode=exact).numpy() == pytest.approx(
        torch.cdist(flat, flat, compute_mode=exact).numpy(), abs=1e-9)


def test_per_loop_summary_is_the_mean_and_quantiles_over_tokens() -> None:
    values = torch.arange(30, dtype=torch.float64).reshape(10, 3) ** 1.5
    summary = per_loop_summary(values)
    assert summary["mean"] == pytest.approx(values.mean(0).tolist())
    for q in (10, 50, 90):
        assert summary[f"q{q}"] == pytest.approx(np.quantile(values.numpy(), q / 100, 0))


def test_run_writes_the_json_and_the_figure_together(tiny_run, tmp_path: Path) -> None:
    data_dir, snap = tiny_run
    out = tmp_path / "traj"
    result = run_trajectories(snap, data_dir, out, tokens=20)
    doc = json.loads((out / "trajectories.json").read_text())
    assert doc == json.loads(json.dumps(result))
    assert (doc["training_loops"], doc["max_loops"], doc["loops"]) == (2, 4, [1, 2, 3, 4])
    assert doc["tokens"] == 20 == sum(doc["classes"].values()) == len(doc["paths"])
    assert set(doc["measures"]) == {"relative_step", "cosine", "kl_to_final"}
    for summary in doc["measures"].values():
        assert all(len(summary[k]) == 4 for k in ("mean", "q10", "q50", "q90"))
    path = doc["paths"][0]
    assert len(path["pca"]) == 5 and len(path["relative_step"]) == 4
    assert path["class"] in doc["classes"]
    assert (out / "trajectories.png").read_bytes().startswith(b"\x89PNG")
    again = run_trajectories(snap, data_dir, out, tokens=20)  # its own output: replaced
    assert [p["pca"] for p in again["paths"]] == [p["pca"] for p in doc["paths"]]


def test_a_foreign_output_directory_is_refused_untouched(tiny_run, tmp_path: Path) -> None:
    data_dir, snap = tiny_run
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep\n")
    with pytest.raises(UsageError, match="is not a trajectories result"):
        run_trajectories(snap, data_dir, tmp_path / "mine", tokens=5)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
