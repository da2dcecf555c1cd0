"""The state-, argmax- and gate-based exit criteria against a direct per-loop computation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.exit.criteria import adaptive_logits
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.sweep_pass import sweep_batch
from pipeline_lib.spec.config_model import ModelConfig

VOCAB, SEQ, H = 30, 16, 5
CASES = {"latent_diff": (0.0, 0.05, 0.2, 0.6), "cosine": (0.0, 0.001, 0.02, 0.2),
         "argmax_stable": (0, 1, 2), "gate": (1.0, 0.3, 0.6, 0.9)}
NEVER = {"latent_diff": 0.0, "cosine": 0.0, "argmax_stable": 0, "gate": 1.0}


@pytest.fixture(scope="module")
def model():
    from pipeline_lib.model.looped import LoopedLM

    torch.manual_seed(4)
    m = LoopedLM(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, loops=2, init_std=0.3,
                             exit_gate=True, state_init="embedding")).eval()
    with torch.no_grad():
        m.exit_gate.weight.normal_(std=0.5)
    return m


@pytest.fixture(scope="module")
def batch():
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, VOCAB, (3, SEQ + 1), generator=gen)
    targets = ids[:, 1:].clone()
    targets[1, -3:] = -100
    return {"input_ids": ids[:, :-1], "targets": targets}


def _direct(model, batch, criterion: str, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss at exit [n], exit loop [n]) by the definitions, loop by loop, on every token."""
    ctx = model.embed(batch)
    valid = batch["targets"].reshape(-1) != -100
    targets = batch["targets"].reshape(-1)[valid]
    state = model.init_state(ctx)
    prev_s, prev_top, run = state.reshape(-1, 16)[valid].float(), None, None
    stay = torch.ones(int(valid.sum()))
    exit_at = torch.full((int(valid.sum()),), H)
    loss = torch.zeros(int(valid.sum()))
    for t in range(1, H + 1):
        state = model.forward_loops(ctx, t - 1, t, state)
        hidden = model.readout_hidden(state, ctx).reshape(-1, 16)[valid]
        logits = F.linear(hidden, model.head_weight).float()
        ce = F.cross_entropy(logits, targets, reduction="none")
        s = state.reshape(-1, 16)[valid].float()
        top = torch.log_softmax(logits, -1).argmax(-1)
        run = torch.zeros_like(top) if run is None else torch.where(top == prev_top, run + 1, 0)
        stay = stay * (1 - torch.sigmoid(model.exit_gate(hidden).squeeze(-1)))
        hit = {"latent_diff": (s - prev_s).norm(dim=-1) / s.norm(dim=-1) < threshold,
               "cosine": 1 - F.cosine_similarity(s, prev_s, dim=-1) < threshold,
               "argmax_stable": run >= threshold if threshold else torch.zeros_like(run).bool(),
               "gate": 1 - stay > threshold}[criterion]
        new = (hit if t < H else torch.ones_like(hit)) & (exit_at == H) & (loss == 0)
        exit_at[new], loss[new] = t, ce[new]
        prev_s, prev_top = s, top
    return loss, exit_at


@pytest.mark.parametrize("criterion", list(CASES))
@torch.no_grad()
def test_criterion_matches_the_direct_computation(model, batch, criterion: str) -> None:
    thresholds = CASES[criterion]
    spec = ExitSpec(thresholds, criterion, H).resolved([H])
    losses, exits = sweep_batch(model, batch, [], [spec]).exits[0]
    for k, x in enumerate(spec.thresholds):
        want_loss, want_exit = _direct(model, batch, criterion, x)
        assert exits[:, k].tolist() == want_exit.tolist(), (criterion, x)
        torch.testing.assert_close(losses[:, 1 + k], want_loss, rtol=1e-5, atol=1e-5)
    never = spec.thresholds.index(NEVER[criterion])
    assert torch.equal(losses[:, 1 + never], losses[:, 0])  # the fixed H-loop result, exactly
    assert exits[:, never].tolist() == [H] * len(exits)
    assert exits.float().mean() < H  # the other thresholds do exit early
    logits, loops = adaptive_logits(model, batch["input_ids"],
                                   ExitSpec((thresholds[-1],), criterion, H))
    assert loops.reshape(-1)[batch["targets"].reshape(-1) != -100].tolist() == \
        exits[:, spec.thresholds.index(thresholds[-1])].tolist()


def test_gate_needs_a_gated_snapshot_and_a_probability(batch) -> None:
    from pipeline_lib.model.looped import LoopedLM

    plain = LoopedLM(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, loops=2)).eval()
    with pytest.raises(ConfigError, match="criterion gate needs a snapshot with the learned"):
        sweep_batch(plain, batch, [], [ExitSpec((0.5,), "gate", H).resolved([H])])
    with pytest.raises(ConfigError, match=r"cumulative exit probability in \[0, 1\]"):
        ExitSpec((1.5,), "gate", H).resolved([H])


def test_sweep_and_summary_carry_every_criterion(tiny_run, tmp_path) -> None:
    import json

    import pyarrow.parquet as pq

    from pipeline_lib.evaluate.exit.summary import summarize_adaptive
    from pipeline_lib.evaluate.heff import run_heff

    data, snap = tiny_run
    specs = [ExitSpec((0.0, 0.1), "kl"), ExitSpec((0, 1), "argmax_stable"),
             ExitSpec((0.0, 0.05), "latent_diff")]
    out = tmp_path / "heff.json"
    result = run_heff(snap, data, [1, 2], out, max_tokens=300, batch_rows=4, adaptive=specs)
    assert list(result["adaptive_by_criterion"]) == ["kl", "argmax_stable", "latent_diff"]
    assert "adaptive" not in result  # the first criterion's copy of earlier versions is gone
    for section in result["adaptive_by_criterion"].values():  # never-exit point = fixed at H
        assert section["points"][0]["loss"] == result["losses"]["2"]
    rows = summarize_adaptive([out], tmp_path / "a.parquet", tmp_path / "a.png")
    table = pq.read_table(tmp_path / "a.parquet").to_pylist()
    assert [(r["criterion"], r["threshold"]) for r in table] == [
        (r["criterion"], r["threshold"]) for r in rows] == [
        ("kl", 0.0), ("kl", 0.1), ("argmax_stable", 0.0), ("argmax_stable", 1.0),
        ("latent_diff", 0.0), ("latent_diff", 0.05)]
    assert (tmp_path / "a.png").stat().st_size > 0
    with pytest.raises(ConfigError, match="criterion gate needs a snapshot"):
        run_heff(snap, data, [1, 2], tmp_path / "g.json", max_tokens=300, batch_rows=4,
                 adaptive=[ExitSpec((0.5,), "gate")])
    assert not (tmp_path / "g.json").exists()
    assert json.loads(out.read_text())["adaptive_by_criterion"]["kl"]["criterion"] == "kl"
