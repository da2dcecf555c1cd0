"""The export's ``generate`` under the exit gate decodes as loopline's ``generate`` does: each
new token stops looping at its gate exit (its later loops never computed) through the
export's ``AdaptiveKVCache``, a later token reads what ``kv_fill`` says of a position that
stopped early, and the loops of every generated token are read off the returned cache. In
fp32 on a tiny random export with the exit gate: the same tokens, loops and logits (1e-5) as
loopline's cached adaptive decoding for ``kv_fill`` latest and skip; a threshold that never
exits is fixed-depth cached generation; a ``kv_fill`` not in the list is refused."""

from __future__ import annotations

import pytest
import torch
from support.export_helpers import (
    SEQ_LEN,
    left_padded,
    library_generate,
    random_model,
    write_model_snapshot,
)

from pipeline_lib.data.tokenizer import byte_level_tokenizer, eos_id
from pipeline_lib.evaluate.exit.cached import CriterionExit
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.generation import CacheOptions, Depth, encode_prompts, generate_texts
from pipeline_lib.export import export_snapshot, loopline_adaptive
from pipeline_lib.export.modeling_loopline import LooplineForCausalLM
from pipeline_lib.model.kv_adaptive import kv_adaptive_prefill, kv_adaptive_step
from pipeline_lib.model.kv_cache import KV_FILLS

PROMPTS = ["a=1;b=", "x=12;y=3;z=a;", "q"]
MAX_NEW = 8


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """(LoopedLM with the exit gate, its export loaded in transformers, the tokenizer)."""
    root = tmp_path_factory.mktemp("adaptive_export")
    tok, model = byte_level_tokenizer(), random_model("dense")
    snap = write_model_snapshot(root / "snapshots" / "step_0000005", model, tok)
    export_snapshot(snap, root / "export")
    return model, LooplineForCausalLM.from_pretrained(root / "export").eval(), tok


def _generate(hf, tok, **kw):
    """(transformers' greedy generate output on the left-padded PROMPTS, prompt width)."""
    eos = eos_id(tok)
    ids, mask = left_padded(encode_prompts(tok, PROMPTS, SEQ_LEN, eos), eos)
    with torch.no_grad():
        run = hf.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False,
                          return_dict_in_generate=True, output_logits=True, pad_token_id=eos,
                          eos_token_id=eos, **kw)
    return run, ids.shape[1]


@pytest.mark.parametrize("kv_fill", KV_FILLS)
@pytest.mark.parametrize(("max_loops", "threshold"), [(5, 0.9), (4, 0.8)])
def test_generate_writes_loopline_s_tokens_with_its_loops_per_token(dense, max_loops, threshold,
                                                                    kv_fill) -> None:
    model, hf, tok = dense
    eos = eos_id(tok)
    want_ids, want_loops, want_logits = library_generate(
        model, encode_prompts(tok, PROMPTS, SEQ_LEN, eos), max_loops, threshold, kv_fill,
        MAX_NEW, eos)
    run, start = _generate(hf, tok, num_loops=max_loops, exit_threshold=threshold,
                           kv_fill=kv_fill)
    assert run.cache.gated and run.cache.kv_fill == kv_fill
    loops = run.cache.exit_loops[:, start - 1:]  # the loops that predicted each new token
    for r, (ids, used, logits) in enumerate(zip(want_ids, want_loops, want_logits, strict=True)):
        got = run.sequences[r, start:].tolist()
        assert got[:len(ids)] == ids and got[len(ids):len(ids) + 1] in ([], [eos]), r
        assert loops[r, :len(used)].tolist() == used, r
        torch.testing.assert_close(torch.stack([run.logits[s][r] for s in range(len(used))]),
                                   torch.stack(logits), atol=1e-5, rtol=0)
    every = [n for row in want_loops for n in row]
    assert min(every) < max_loops and max(every) == max_loops  # early exits and full depth
    # loopline's generate (the command's library call): the same tokens and mean loops
    ours = generate_texts(model, tok, PROMPTS, context_len=SEQ_LEN, max_new_tokens=MAX_NEW,
                          depth=Depth(max_loops, ExitSpec((threshold,), "gate", max_loops)),
                          cache=CacheOptions(kv_fill=kv_fill))
    for g, ids, used in zip(ours, want_ids, want_loops, strict=True):
        assert g.ids == ids and g.mean_loops == pytest.approx(sum(used) / len(used), abs=1e-12)


@torch.no_grad()
def test_cached_steps_equal_loopline_s_adaptive_prefill_and_steps(dense) -> None:
    """A prompt prefilled, then one token per row and step through the cache (teacher
    forced): each step's logits within 1e-5 and exit loops equal to loopline's
    ``kv_adaptive_prefill`` / ``kv_adaptive_step``, for both fills; and the fills differ."""
    model, hf, _ = dense
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(5))
    kw = {"num_loops": 4, "exit_threshold": 0.7}
    logits = {}
    for fill in KV_FILLS:
        rule = CriterionExit(model, ExitSpec((0.7,), "gate", 4))
        want, want_loops, lib_cache = kv_adaptive_prefill(model, ids[:, :6], rule, kv_fill=fill)
        out = hf(ids[:, :6], use_cache=True, kv_fill=fill, **kw)
        steps = []
        for j in range(6, 13):
            torch.testing.assert_close(out.logits[:, -1], want, atol=1e-5, rtol=0)
            assert torch.equal(out.exit_loops[:, -1], want_loops), (fill, j)
            steps.append(out.logits[:, -1])
            if j < 12:
                want, want_loops = kv_adaptive_step(model, lib_cache, ids[:, j], rule)
                out = hf(ids[:, j:j + 1], cache=out.cache, kv_fill=fill, **kw)
        cache, cfg = out.cache, hf.config
        assert len(cache.keys) == cfg.prelude_layers + 4 * cfg.core_layers + cfg.coda_layers
        assert cache.get_seq_length() == 12 and cache.reached[:, :6].eq(4).all()
        assert cache.reached[:, 6:].lt(4).any()  # decoded tokens stopped early
        assert torch.equal(cache.reached[:, 6:], cache.exit_loops[:, 6:])
        logits[fill] = torch.stack(steps)
    assert not torch.allclose(logits["latest"], logits["skip"], atol=1e-4)


@pytest.mark.parametrize("threshold", [1.0, 0.999])
def test_a_threshold_that_never_exits_is_fixed_depth_cached_generation(dense, threshold) -> None:
    """T = 1 is the fixed-depth path itself; 0.999 runs the adaptive cache, where no token
    of this model exits early: the tokens of fixed depth, logits within 1e-5, beam search too."""
    _, hf, tok = dense
    fixed, start = _generate(hf, tok, num_loops=4)
    never, _ = _generate(hf, tok, num_loops=4, exit_threshold=threshold)
    assert torch.equal(never.sequences, fixed.sequences)
    torch.testing.assert_close(torch.stack(never.logits), torch.stack(fixed.logits), atol=1e-5,
                               rtol=0)
    assert never.cache.gated == (threshold < 1)
    if threshold < 1:
        assert never.cache.exit_loops[:, start - 1:].eq(4).all()
        assert never.cache.reached.eq(4).all()
    beams = [_generate(hf, tok, num_loops=4, num_beams=3, **kw)[0].sequences
             for kw in ({}, {"exit_threshold": threshold})]
    assert torch.equal(*beams)


def test_a_kv_fill_not_in_the_list_is_refused(dense) -> None:
    _, hf, _ = dense
    assert loopline_adaptive.KV_FILLS == KV_FILLS  # the export's copy of loopline's list
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(1))
    message = r"^kv_fill='nearest' is not one of \['latest', 'skip'\]; use kv_fill='latest'"
    with pytest.raises(ValueError, match=message):
        hf(ids, exit_threshold=0.7, kv_fill="nearest")
    with pytest.raises(ValueError, match=message):
        hf.generate(ids, exit_threshold=0.7, kv_fill="nearest", max_new_tokens=2)
    with pytest.raises(ValueError, match=message):  # a typo is refused at fixed depth too
        hf(ids, kv_fill="nearest")
