"""KV-cached generation is exact against recomputing the whole window (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.model.generate import CachedNextIds, greedy_decode, greedy_generate
from pipeline_lib.model.kv_cache import attention_calls
from pipeline_lib.model.looped import LoopedLM

TOL = 1e-5  # fp32: only the matmul shapes differ between the two paths

VARIANTS = {
    "dense": {},
    "moe": {"moe_experts": 4, "moe_top_k": 2},
    "linear_zeros_nocoda": {"injection": "linear", "state_init": "zeros", "coda_layers": 0},
    "step_emb_2core": {"step_embedding": True, "core_layers": 2, "state_init": "embedding",
                       "tie_embeddings": False, "learned_positions": 64},
    # grouped-query attention (the cache holds the 2 kv heads) and Llama 3 RoPE scaling
    "gqa_llama3_rope": {"n_heads": 4, "n_kv_heads": 2, "rope_scaling": "llama3",
                        "rope_scaling_factor": 8.0, "rope_original_max_position": 1000},
    # imported families: Qwen3-like (q/k/v biases, per-head QK-norm, heads of width 6 ≠ 16/4)
    # and OLMo-2-like (QK-norm over all heads, post-norm blocks)
    "qwen_head_dim": {"n_heads": 4, "n_kv_heads": 2, "head_dim": 6, "qkv_bias": True,
                      "qk_norm": "head"},
    "olmo2_post_norm": {"qk_norm": "all_heads", "norm_placement": "post"},
    # gated loops (gates set away from 0 below) from the noise start (zeros in eval mode)
    "gated_noise": {"recurrence": "gated", "state_init": "noise"},
}


@pytest.fixture
def build(make_config):
    def _model(variant: str) -> LoopedLM:
        torch.manual_seed(3)
        model = LoopedLM(make_config(init_std=0.3, **VARIANTS[variant])).eval()
        if model.loop_gate is not None:
            with torch.no_grad():
                model.loop_gate.copy_(torch.tensor([0.5, -0.25]))
        return model

    return _model


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("h_eff", [1, 3, 7])  # the model trains with 3 loops: 7 extrapolates
def test_decode_steps_match_the_uncached_window(build, variant: str, h_eff: int) -> None:
    model = build(variant)
    gen = torch.Generator().manual_seed(h_eff)
    ids = torch.randint(1, model.cfg.vocab_size, (3, 9), generator=gen)
    lengths = torch.tensor([9, 4, 6])  # right-padded rows of different lengths
    logits, cache = model.prefill(ids, h_eff, lengths)
    assert len(cache.keys) == attention_calls(model.cfg, h_eff)
    assert cache.keys[0].shape[1] == (model.cfg.n_kv_heads or model.cfg.n_heads)
    rows = [ids[b, : int(n)].tolist() for b, n in enumerate(lengths)]
    for _ in range(12):  # past the first capacity (9): the cache grows on the way
        reference = torch.stack([model.logits_at(torch.tensor([r]), h_eff)[0, -1] for r in rows])
        assert (logits - reference).abs().max() <= TOL
        nxt = reference.argmax(dim=-1)
        assert torch.equal(logits.argmax(dim=-1), nxt)
        for row, token in zip(rows, nxt.tolist(), strict=True):
            row.append(token)
        logits = model.decode_step(cache, nxt)
    assert cache.lengths.tolist() == [len(r) for r in rows]
    assert cache.capacity >= max(len(r) for r in rows)


@pytest.mark.parametrize("variant", ["dense", "moe", "gqa_llama3_rope"])
def test_packed_rows_continue_their_last_document(build, make_batch, variant: str) -> None:
    """A prefill over a packed batch (documents, restarting positions) continues the last
    document of each row: the uncached reference is the batch with the tokens appended to
    that document (next position, same document id)."""
    model = build(variant)
    batch = make_batch([[4, 3], [2, 2, 2]], seed=5)
    L = batch["input_ids"].shape[1]
    logits, cache = model.prefill(batch, 4)
    grown = {k: batch[k].clone() for k in ("input_ids", "position_ids", "doc_ids")}
    for step in range(5):
        reference = model.logits_at(grown, 4)[:, -1]
        assert (logits - reference).abs().max() <= TOL, step
        nxt = reference.argmax(dim=-1)
        last = {k: v[:, -1:] for k, v in grown.items()}
        grown = {"input_ids": torch.cat([grown["input_ids"], nxt[:, None]], 1),
                 "position_ids": torch.cat([grown["position_ids"], last["position_ids"] + 1], 1),
                 "doc_ids": torch.cat([grown["doc_ids"], last["doc_ids"]], 1)}
        logits = model.decode_step(cache, nxt)
    assert cache.positions.tolist() == (batch["position_ids"][:, -1] + 6).tolist()
    assert grown["input_ids"].shape[1] == L + 5


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("h_eff", [2, 5])
def test_greedy_generate_cached_equals_uncached(build, variant: str, h_eff: int) -> None:
    """Same tokens and stop reasons, rows of different lengths and budgets stopping on
    their own (EOS, length), and a window that slides past context_len."""
    model = build(variant)
    prompts = [[5, 6, 7, 8], [9], [10, 11], [3, 4, 5, 6, 7, 8, 9]]
    budgets = [14, 3, 9, 12]
    kwargs = dict(h_eff=h_eff, eos_id=2, context_len=12)
    cached = greedy_generate(model, prompts, budgets, **kwargs)
    plain = greedy_generate(model, prompts, budgets, use_cache=False, **kwargs)
    assert cached == plain
    assert sum(len(new) for new, _ in cached) > 20
    unbounded = greedy_generate(model, prompts, budgets, h_eff=h_eff, eos_id=None,
                                context_len=12)
    assert unbounded == greedy_generate(model, prompts, budgets, h_eff=h_eff, eos_id=None,
                                        context_len=12, use_cache=False)
    assert [len(new) for new, _ in unbounded] == budgets


def test_cache_is_reused_until_the_window_slides(build) -> None:
    """One prefill, then one decode step per token, until a row reaches context_len: from
    there every step is a prefill of the slid window (what the uncached path computes)."""
    model = build("dense")
    decoder = CachedNextIds(model, 3)
    out = greedy_decode(decoder, [[1, 2, 3]], [6], eos_id=None, context_len=20)
    assert len(out[0][0]) == 6 and (decoder.prefills, decoder.steps) == (1, 5)
    decoder = CachedNextIds(model, 3)
    greedy_decode(decoder, [[1, 2, 3]], [6], eos_id=None, context_len=5)
    # lengths 3 (prefill), 4 and 5 (cached); then the window slides: 3 more prefills
    assert (decoder.prefills, decoder.steps) == (4, 2)


def test_prefill_rejects_bad_lengths(build) -> None:
    model = build("dense")
    with pytest.raises(ValueError, match="lengths must hold 2 values in 1..3"):
        model.prefill(torch.ones(2, 3, dtype=torch.long), 2, torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="h_eff must be at least 1"):
        model.prefill(torch.ones(1, 3, dtype=torch.long), 0)


def test_a_decoding_step_dispatches_far_fewer_operations_than_the_window() -> None:
    """At one token a step is bound by per-call overhead, not arithmetic (docs/performance.md,
    bench_generate), so the number of operator calls is what the cache's speed-up rests on:
    a step of the default model must stay well under a 64-token window's (179 vs 296 when
    written; the decoding path before its [B, D] form took 380, more than the window)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from pipeline_lib.spec.config_load import load_config

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            return func(*args, **(kwargs or {}))

    cfg = load_config().model
    cfg.vocab_size = 258
    torch.manual_seed(0)
    model = LoopedLM(cfg).eval()
    ids = torch.randint(1, 258, (1, 64), generator=torch.Generator().manual_seed(0))
    logits, cache = model.prefill(ids[:, :32], cfg.loops, reserve=32)
    with Count() as step:
        model.decode_step(cache, logits.argmax(-1))
    with torch.no_grad(), Count() as window:
        model.logits_at(ids, cfg.loops)
    assert step.calls <= 0.65 * window.calls, (step.calls, window.calls)
