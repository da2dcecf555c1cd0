"""Scoring on the device gives the loglikelihoods of the old path (the whole [B, L, V]
log-softmax copied to the CPU, then gathered there) to the bit."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from lm_eval.api.instance import Instance
from snapshot_helpers import SEQ_LEN, tiny_model_config

from pipeline_lib.bench import LooplineLM
from pipeline_lib.bench.lm_requests import score_windows
from pipeline_lib.bench.target_scores import target_scores
from pipeline_lib.model.looped import LoopedLM


@pytest.fixture(scope="module")
def model() -> LoopedLM:
    torch.manual_seed(4)
    return LoopedLM(replace(tiny_model_config(), tie_embeddings=False, init_std=0.2)).eval()


def old_scores(model: LoopedLM, windows, h_eff: int, pad: int
               ) -> list[tuple[float, bool, tuple[int, ...]]]:
    """The scoring code before issue 14, verbatim in substance: [B, L, V] log-probs on the
    CPU, each window's targets gathered there."""
    width = max(len(inputs) for inputs, _ in windows)
    ids = torch.full((len(windows), width), pad, dtype=torch.long)
    for i, (inputs, _) in enumerate(windows):
        ids[i, : len(inputs)] = torch.tensor(inputs)
    logp = torch.log_softmax(model.logits_at(ids, h_eff).float(), dim=-1).cpu()
    out = []
    for row, (inputs, targets) in enumerate(windows):
        n = len(targets)
        picked = logp[row, len(inputs) - n: len(inputs)]
        target = torch.tensor(targets, dtype=torch.long)
        total = picked.gather(1, target[:, None]).double().sum().item()
        out.append((float(total), bool((picked.argmax(dim=-1) == target).all()),
                    (h_eff,) * n))
    return out


WINDOWS = [([5, 6, 7, 8, 9], [8, 9, 10]), ([3], [4]), ([1, 2, 3, 4, 5, 6, 7], [7]),
           ([9, 9, 9], [9, 9, 9])]


@pytest.mark.parametrize("h_eff", [1, 3])
def test_target_scores_equal_the_old_gather_exactly(model: LoopedLM, h_eff: int) -> None:
    want = old_scores(model, WINDOWS, h_eff, pad=0)
    width = max(len(i) for i, _ in WINDOWS)
    ids = torch.zeros(len(WINDOWS), width, dtype=torch.long)
    for b, (inputs, _) in enumerate(WINDOWS):
        ids[b, : len(inputs)] = torch.tensor(inputs)
    with torch.no_grad():
        logits = model.logits_at(ids, h_eff)
    loops = torch.full(ids.shape, h_eff)
    assert target_scores(logits, loops, WINDOWS) == want  # floats compared with ==


@pytest.mark.parametrize("batch_size", [1, 3])
def test_loglikelihood_through_the_lm_equals_the_old_path(model, tokenizer, batch_size):
    lm = LooplineLM(model=model, tokenizer=tokenizer, seq_len=SEQ_LEN, h_eff=2,
                    batch_size=batch_size)
    pairs = [("0123", "456"), ("a=7;b=a;print(b)=", "7"), ("x" * 40, " tail" * 6),
             ("", "0123"), ("parity(1011)=", "1")]
    enc = lambda s: tokenizer.encode(s).ids  # noqa: E731
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, 0) for p in pairs],
                           disable_tqdm=True)
    windows, owner = [], []
    for r, (ctx, cont) in enumerate(pairs):
        for w in score_windows(enc(ctx) or [lm.eot_token_id], enc(cont), SEQ_LEN):
            windows.append(w)
            owner.append(r)
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][0]))  # the LM's batches
    scores: dict[int, tuple[float, bool, tuple[int, ...]]] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        scores.update(zip(chunk, old_scores(model, [windows[i] for i in chunk], 2,
                                            lm.eot_token_id), strict=True))
    want = [(0.0, True)] * len(pairs)
    for i, r in enumerate(owner):
        want[r] = (want[r][0] + scores[i][0], want[r][1] and scores[i][1])
    assert got == want
    assert len(windows) > len(pairs)  # the long continuation spans several windows


def test_target_scores_return_each_targets_own_loops(model: LoopedLM) -> None:
    """Under adaptive exit every target keeps its own exit loop (its position's, not the
    window's sum): what the loops-used histograms count."""
    width = max(len(i) for i, _ in WINDOWS)
    ids = torch.zeros(len(WINDOWS), width, dtype=torch.long)
    for b, (inputs, _) in enumerate(WINDOWS):
        ids[b, : len(inputs)] = torch.tensor(inputs)
    with torch.no_grad():
        logits = model.logits_at(ids, 2)
    loops = torch.arange(ids.numel()).reshape(ids.shape) % 5 + 1  # [B, L]
    got = [used for _, _, used in target_scores(logits, loops, WINDOWS)]
    want = [tuple(loops[b, len(inputs) - len(targets): len(inputs)].tolist())
            for b, (inputs, targets) in enumerate(WINDOWS)]
    assert got == want and len(set(want[0])) == 3
