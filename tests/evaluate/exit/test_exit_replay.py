"""The sweep's replay of cached adaptive decoding equals decoding each document piece token
by token with kv_adaptive_prefill / kv_adaptive_step, fed the true next token (fp32): loop
by loop without coda blocks (replay_loops), step by step with them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.evaluate.exit.cached import CriterionExit
from pipeline_lib.evaluate.exit.replay import replay_batch
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.sweep_pass import sweep_batch
from pipeline_lib.model.kv_adaptive import kv_adaptive_prefill, kv_adaptive_step
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig

VOCAB, SEQ, H = 30, 16, 4


@pytest.fixture(scope="module", params=[0, 1], ids=["loop_by_loop", "coda_step_by_step"])
def model(request) -> LoopedLM:
    torch.manual_seed(4)
    return LoopedLM(ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, n_kv_heads=1,
                                loops=2, init_std=0.3, core_layers=2,
                                coda_layers=request.param)).eval()


def _batch(answer_only: bool) -> dict[str, torch.Tensor]:
    """Three rows of two documents (pieces of 6 and 9 tokens, one padding column); with
    ``answer_only`` only the last 3 targets of each piece are scored."""
    gen = torch.Generator().manual_seed(6)
    ids = torch.randint(0, VOCAB, (3, SEQ + 1), generator=gen)
    doc = torch.tensor([0] * 6 + [1] * 9 + [2]).expand(3, SEQ).clone()
    pos = torch.cat([torch.arange(6), torch.arange(9), torch.zeros(1, dtype=torch.long)])
    targets = ids[:, 1:].clone()
    targets[:, [5, 14, 15]] = -100  # the last token of each piece, and the padding
    if answer_only:
        targets[:, [0, 1, 6, 7, 8, 9, 10, 11]] = -100
    return {"input_ids": ids[:, :-1], "targets": targets, "doc_ids": doc,
            "position_ids": pos.expand(3, SEQ).clone()}


def _token_by_token(model, batch, spec: ExitSpec, fill: str) -> tuple[list, list]:
    """(losses [K][n], loops [K][n]) of the scored tokens in row-major order: every piece
    decoded alone, its prompt up to its first scored position."""
    losses, loops = [], []
    for x in spec.thresholds:
        ce, used = [], []
        for b in range(batch["targets"].shape[0]):
            doc = batch["doc_ids"][b]
            for d in doc.unique().tolist():
                cols = (doc == d).nonzero().squeeze(1)
                scored = cols[batch["targets"][b, cols] != -100]
                if not len(scored):
                    continue
                first, last = int(scored[0]), int(scored[-1])
                prompt = {k: batch[k][b, int(cols[0]):first + 1][None]
                          for k in ("input_ids", "position_ids")}
                rule = CriterionExit(model, ExitSpec((x,), spec.criterion, H))
                out, n, cache = kv_adaptive_prefill(model, prompt, rule, kv_fill=fill)
                for p in range(first, last + 1):
                    if p > first:
                        out, n = kv_adaptive_step(model, cache, batch["input_ids"][b, p:p + 1],
                                                  rule)
                    if batch["targets"][b, p] != -100:
                        ce.append(float(F.cross_entropy(out, batch["targets"][b, p:p + 1])))
                        used.append(int(n[0]))
        losses.append(ce)
        loops.append(used)
    return losses, loops


@pytest.mark.parametrize("fill", ["latest", "skip"])
@pytest.mark.parametrize(("criterion", "thresholds", "answer_only"), [
    ("kl", (0.0, 0.01, 0.02), False), ("argmax_stable", (0, 2), True)])
def test_the_replay_is_token_by_token_cached_decoding(model, fill, criterion, thresholds,
                                                      answer_only) -> None:
    batch = _batch(answer_only)
    spec = ExitSpec(thresholds, criterion, H)
    needs = sweep_batch(model, batch, [], [spec]).exits[0]
    got = replay_batch(model, batch, spec, fill, needs)
    want_losses, want_loops = _token_by_token(model, batch, spec, fill)
    for k, x in enumerate(thresholds):
        if x == 0:  # never exits early: not replayed, the fixed loss at max loops
            assert torch.equal(got.losses[:, 1 + k], needs[0][:, 0])
            assert got.loops[:, k].tolist() == [H] * len(needs[0])
            continue
        loops = got.loops[:, k].tolist()
        assert loops == want_loops[k]
        assert min(loops) < H and max(loops) == H  # early exits and tokens that loop on
        assert torch.allclose(got.losses[:, 1 + k], torch.tensor(want_losses[k]), atol=1e-5,
                              rtol=0)
    assert torch.equal(got.losses[:, 0], needs[0][:, 0])
    calls = 1 + 2 * H + model.cfg.coda_layers  # × (keys, values) × 1 kv head × 8 × fp32
    assert got.kv_bytes_per_token == calls * 2 * 8 * 4


def test_latest_and_skip_decode_differently(model) -> None:
    """A later token reads an exited token's last keys and values, or skips them: the
    decoder's predictions differ between fills, and its exits from the one pass's."""
    batch, spec = _batch(False), ExitSpec((0.005, 0.01, 0.02, 0.05), "kl", H)
    needs = sweep_batch(model, batch, [], [spec]).exits[0]
    latest = replay_batch(model, batch, spec, "latest", needs)
    skip = replay_batch(model, batch, spec, "skip", needs)
    assert not torch.allclose(latest.losses, skip.losses)
    assert not (torch.equal(latest.loops, needs[1]) and torch.equal(skip.loops, needs[1]))
