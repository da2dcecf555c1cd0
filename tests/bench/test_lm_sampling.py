"""Sampled ``generate_until``: lm-eval's generation kwargs honoured, each answer seeded per
request (seed, task, doc_id, repeat, H_eff), greedy unchanged, bad kwargs refused first."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from lm_eval.api.instance import Instance
from snapshot_helpers import SEQ_LEN, greedy_reference, tiny_model_config

from pipeline_lib.bench import LooplineLM
from pipeline_lib.bench.lm_requests import repeat_indices, request_seed
from pipeline_lib.errors import ConfigError

PROMPTS = ["345", "0", "12", "a=1;b=a;", "qwerty", "789"]


@pytest.fixture(scope="module")
def random_model():
    from pipeline_lib.model.looped import LoopedLM

    torch.manual_seed(1)  # an untrained model: next-token distributions far from one-hot
    return LoopedLM(replace(tiny_model_config(), tie_embeddings=False, init_std=0.2)).eval()


def make_lm(model, tokenizer, **kwargs) -> LooplineLM:
    kwargs.setdefault("h_eff", 2)
    return LooplineLM(model=model, tokenizer=tokenizer, seq_len=SEQ_LEN, **kwargs)


def request(prompt: str, doc_id: int, task: str = "t", **gen_kwargs) -> Instance:
    gen_kwargs.setdefault("until", [])
    gen_kwargs.setdefault("max_gen_toks", 8)
    return Instance("generate_until", {}, (prompt, gen_kwargs), 0, metadata=(task, doc_id, 1))


def run(lm: LooplineLM, requests: list[Instance]) -> list[str]:
    return lm.generate_until(requests, disable_tqdm=True)


def greedy(model, tokenizer, prompt: str, h_eff: int = 2, budget: int = 8) -> str:
    eos = tokenizer.token_to_id("<|endoftext|>")
    return tokenizer.decode(greedy_reference(model, tokenizer.encode(prompt).ids, h_eff,
                                             budget, eos))


def test_temperature_one_samples_and_temperature_zero_is_greedy(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, batch_size=4)
    want = [greedy(random_model, tokenizer, p) for p in PROMPTS]
    for zero in ({"do_sample": True, "temperature": 0.0}, {"do_sample": False, "temperature": 1.0},
                 {"temperature": 0}, {"do_sample": True, "temperature": 1.0, "top_k": 1}):
        assert run(lm, [request(p, i, **zero) for i, p in enumerate(PROMPTS)]) == want, zero
    hot = run(lm, [request(p, i, do_sample=True, temperature=1.0) for i, p in enumerate(PROMPTS)])
    assert sum(h != w for h, w in zip(hot, want, strict=True)) >= 5
    warm = run(lm, [request(p, i, temperature=1.0) for i, p in enumerate(PROMPTS)])  # no do_sample
    assert warm == hot  # a temperature above 0 samples, the same draws as do_sample: true


def test_greedy_rows_are_bit_identical_beside_sampled_rows(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, batch_size=len(PROMPTS))
    mixed = run(lm, [request(p, i, **({"do_sample": True} if i % 2 else {}))
                     for i, p in enumerate(PROMPTS)])
    alone = run(lm, [request(p, i) for i, p in enumerate(PROMPTS)])
    assert mixed[0::2] == alone[0::2] and mixed[1::2] != alone[1::2]


def test_the_same_seed_gives_the_same_samples_whatever_the_batch_or_the_order(random_model,
                                                                             tokenizer):
    reqs = [request(p, i, do_sample=True, temperature=1.0) for i, p in enumerate(PROMPTS)]
    first = run(make_lm(random_model, tokenizer, batch_size=4, seed=3), reqs)
    assert run(make_lm(random_model, tokenizer, batch_size=4, seed=3), reqs) == first
    assert run(make_lm(random_model, tokenizer, batch_size=4, seed=4), reqs) != first
    # a resumed run: only the requests not yet answered, in another batch and order
    rest = run(make_lm(random_model, tokenizer, batch_size=1, seed=3), reqs[:1:-1])
    assert rest == first[:1:-1]
    assert run(make_lm(random_model, tokenizer, batch_size=6, seed=3), reqs) == first
    # H_eff is part of each answer's seed: another depth draws afresh
    assert run(make_lm(random_model, tokenizer, batch_size=4, seed=3, h_eff=3), reqs) != (
        run(make_lm(random_model, tokenizer, batch_size=4, seed=3, h_eff=3),
            [request(p, i, task="other", do_sample=True) for i, p in enumerate(PROMPTS)]))


def test_repeats_of_one_request_are_distinct_draws(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, batch_size=3, seed=0)
    one = request("345", 7, do_sample=True, temperature=1.0)
    answers = run(lm, [one] * 5)  # what lm-eval's evaluator hands over for repeats: 5
    assert len(set(answers)) >= 4
    assert run(lm, [one] * 2) == answers[:2]  # repeat n is repeat n
    seeds = {request_seed(0, "t", 7, 0, r, "2", "345") for r in range(5)}
    assert len(seeds) == 5 and repeat_indices(["a", "b", "a", "a", "b"]) == [0, 0, 1, 2, 1]


def test_sampling_keeps_the_cache_and_adaptive_exit(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, h_eff="adaptive:1e9:3", batch_size=3)
    reqs = [request(p, i, do_sample=True, temperature=0.0) for i, p in enumerate(PROMPTS[:3])]
    assert run(lm, reqs) == run(lm, [request(p, i) for i, p in enumerate(PROMPTS[:3])])
    lm.reset_loop_stats()
    run(lm, [request(p, i, do_sample=True) for i, p in enumerate(PROMPTS[:3])])
    tokens = sum(sum(c.values()) for c in lm.loops_used.documents("t", generated=True).values())
    assert lm.mean_loops == {"t": 1.0}  # a huge KL threshold exits every token at loop 1
    assert lm.loops_used.loops_per_answer("t") == tokens / 3
    assert 3 <= tokens <= 3 * 8  # at most max_gen_toks per answer (or EOS sooner)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"temperature": -0.5}, "task bad: generation_kwargs temperature=-0.5 must be a number >= 0"),
    ({"do_sample": True, "top_p": 0.0}, "task bad: generation_kwargs top_p=0.0 must lie in (0, 1]"),
    ({"top_p": 1.5}, "task bad: generation_kwargs top_p=1.5 must lie in (0, 1]"),
    ({"do_sample": True, "top_k": 0}, "task bad: generation_kwargs top_k=0 must be a whole number"),
    ({"do_sample": "maybe"}, "task bad: generation_kwargs do_sample='maybe' is not a boolean"),
])
def test_bad_generation_kwargs_are_refused_before_any_decoding(random_model, tokenizer, kwargs,
                                                               words):
    lm = make_lm(random_model, tokenizer, batch_size=1)
    reqs = [request("345", 0, do_sample=True), request("0", 1, task="bad", **kwargs)]
    with pytest.raises(ConfigError) as err:
        run(lm, reqs)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)
    assert lm.loops_used.tasks() == []  # the first request was not decoded either


def test_seed_model_arg_is_checked(random_model, tokenizer):
    with pytest.raises(ConfigError, match=r"seed=-1 must be an integer >= 0"):
        make_lm(random_model, tokenizer, seed=-1)
