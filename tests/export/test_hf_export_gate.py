"""The exported model honours the learned exit gate: ``forward(…, exit_threshold=T)`` reads
each position out at its gate exit loop with loopline's ``adaptive_logits`` (criterion ``gate``)
logits and exit loops (bit for bit), left padding changes nothing, the KV cache is bound to
its loop count, mode and ``kv_fill``, ``config.exit_threshold`` is the default, bad
thresholds are refused; and with transformers alone, cached ``generate`` with a threshold
writes loopline's ``generate`` text with the same loops per token (cached adaptive decoding,
``kv_fill`` latest and skip; in-process exactness: ``test_hf_export_adaptive.py``), while
``use_cache=False`` writes what loopline's adaptive readout of each whole window does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from support.export_helpers import (
    SEQ_LEN,
    library_generate,
    random_model,
    run_hf_worker,
    write_model_snapshot,
)

from pipeline_lib.data.tokenizer import byte_level_tokenizer, eos_id
from pipeline_lib.evaluate.exit.criteria import adaptive_logits
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.evaluate.generation import CacheOptions, Depth, encode_prompts, generate_texts
from pipeline_lib.export import export_snapshot
from pipeline_lib.export.modeling_loopline import LooplineForCausalLM
from pipeline_lib.model.generate import greedy_decode, padded_rows

THRESHOLDS = [0.0, 0.3, 0.5, 0.7, 0.9, 1.0]
PROMPTS = ["a=1;b=", "x=12;y=3;z=a;", "q"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, Path]]:
    """name → (LoopedLM, its export): "dense" has the exit gate (2 training loops), "gqa"
    has none."""
    root = tmp_path_factory.mktemp("gate_exports")
    tok = byte_level_tokenizer()
    out = {}
    for name in ("dense", "gqa"):
        model = random_model(name)
        snap = write_model_snapshot(root / name / "snapshots" / "step_0000005", model, tok)
        export_snapshot(snap, root / name / "export")
        out[name] = (model, root / name / "export")
    return out


def _load(export: Path, **kw) -> LooplineForCausalLM:
    return LooplineForCausalLM.from_pretrained(export, **kw).eval()


def _ids(rows: int = 2, length: int = 12, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, 256, (rows, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("max_loops", [1, 3, 5])
@torch.no_grad()
def test_gated_logits_and_exit_loops_equal_loopline_s_adaptive_readout(exports,
                                                                       max_loops) -> None:
    model, export = exports["dense"]
    hf, ids = _load(export), _ids()
    spread = set()
    for threshold in THRESHOLDS:
        out = hf(ids, num_loops=max_loops, exit_threshold=threshold)
        logits, exits = adaptive_logits(model, ids, ExitSpec((threshold,), "gate", max_loops))
        assert torch.equal(out.exit_loops, exits), threshold
        assert torch.equal(out.logits, logits), threshold
        spread.add(len(exits.unique()))
    assert max_loops == 1 or max(spread) >= 2  # mixed exits: the gate picks the readout


@torch.no_grad()
def test_left_padding_changes_no_gated_readout(exports) -> None:
    _, export = exports["dense"]
    hf, ids = _load(export), _ids(1, 10)
    padded = torch.cat([torch.full((1, 3), 257), ids], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 10, dtype=torch.long)],
                     dim=1)
    plain = hf(ids, num_loops=4, exit_threshold=0.7)
    got = hf(padded, attention_mask=mask, num_loops=4, exit_threshold=0.7)
    assert torch.equal(got.exit_loops[:, 3:], plain.exit_loops)
    torch.testing.assert_close(got.logits[:, 3:], plain.logits, atol=1e-5, rtol=0)


@torch.no_grad()
def test_without_a_threshold_or_at_one_the_depth_is_fixed(exports) -> None:
    model, export = exports["dense"]
    hf, ids = _load(export), _ids()
    fixed = hf(ids, num_loops=3, use_cache=True)
    assert torch.equal(fixed.logits, model.logits_at(ids, 3)) and fixed.exit_loops is None
    assert fixed.cache.gated is False
    never = hf(ids, num_loops=3, exit_threshold=1.0, use_cache=True)  # never exits early
    assert torch.equal(never.logits, fixed.logits)
    assert never.exit_loops.tolist() == [[3] * 12] * 2 and never.cache.gated is False
    assert json.loads((export / "config.json").read_text())["exit_threshold"] is None


@torch.no_grad()
def test_config_exit_threshold_is_the_default_of_forward_and_generate(exports) -> None:
    _, export = exports["dense"]
    hf, gated = _load(export), _load(export, exit_threshold=0.7)
    ids = _ids()
    assert gated.config.exit_threshold == 0.7
    assert torch.equal(gated(ids, num_loops=4).logits,
                       hf(ids, num_loops=4, exit_threshold=0.7).logits)
    prompt = torch.tensor([byte_level_tokenizer().encode(PROMPTS[1]).ids])
    kw = {"num_loops": 4, "max_new_tokens": 6, "do_sample": False}
    explicit = hf.generate(prompt, exit_threshold=0.7, **kw)
    assert torch.equal(gated.generate(prompt, **kw), explicit)
    fixed = hf.generate(prompt, **kw)
    assert not torch.equal(fixed, explicit)  # the gate changes what is written here
    assert torch.equal(gated.generate(prompt, exit_threshold=1.0, **kw), fixed)


@torch.no_grad()
def test_from_pretrained_defaults_leave_generate_s_own_arguments_in_force(exports) -> None:
    """transformers also copies from_pretrained's keyword arguments into the generation
    config, where they would swallow generate()'s num_loops and exit_threshold."""
    _, export = exports["dense"]
    prompt = torch.tensor([byte_level_tokenizer().encode(PROMPTS[1]).ids])
    kw = {"max_new_tokens": 6, "do_sample": False}
    hf, deep = _load(export), _load(export, num_loops=7, exit_threshold=0.9)
    assert (deep.config.num_loops, deep.config.exit_threshold) == (7, 0.9)
    assert not hasattr(deep.generation_config, "num_loops")
    assert not hasattr(deep.generation_config, "exit_threshold")
    one = hf.generate(prompt, num_loops=1, **kw)
    assert not torch.equal(one, hf.generate(prompt, num_loops=7, exit_threshold=0.9, **kw))
    assert torch.equal(deep.generate(prompt, num_loops=1, exit_threshold=1.0, **kw), one)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, "high"])
def test_a_threshold_outside_0_1_is_refused(exports, bad) -> None:
    _, export = exports["dense"]
    hf = _load(export)
    message = r"^exit_threshold=.* must be a cumulative exit probability in \[0, 1\]"
    with pytest.raises(ValueError, match=message):
        hf(_ids(), exit_threshold=bad)
    with pytest.raises(ValueError, match=message):
        hf.generate(_ids(1, 4), exit_threshold=bad, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"^config\.exit_threshold \(config\.json\)=.* in \[0, 1\]"):
        _load(export, exit_threshold=bad)


def test_a_model_without_the_gate_refuses_a_threshold(exports) -> None:
    _, export = exports["gqa"]
    hf = _load(export)
    assert hf.exit_gate is None
    with pytest.raises(ValueError, match=r"^exit_threshold=0\.9 needs the learned exit gate"):
        hf(_ids(), exit_threshold=0.9)
    with pytest.raises(ValueError, match=r"^exit_threshold=0\.9 needs the learned exit gate"):
        hf.generate(_ids(1, 4), exit_threshold=0.9, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"^config\.exit_threshold \(config\.json\)=0\.9 needs"):
        _load(export, exit_threshold=0.9)


@torch.no_grad()
def test_a_cache_is_bound_to_its_loop_count_mode_and_kv_fill(exports) -> None:
    _, export = exports["dense"]
    hf, ids = _load(export), _ids()
    gated = hf(ids[:, :8], num_loops=3, exit_threshold=0.7, use_cache=True).cache
    with pytest.raises(ValueError, match=r"^this cache holds 3 loops read out by the exit gate "
                                         r"\(kv_fill 'latest'\); the pass asks for 3 loops at "
                                         r"fixed depth"):
        hf(ids[:, 8:], num_loops=3, cache=gated)
    fixed = hf(ids[:, :8], num_loops=3, use_cache=True).cache
    with pytest.raises(ValueError, match=r"holds 3 loops at fixed depth; the pass asks for 3 "
                                         r"loops read out by the exit gate \(kv_fill 'latest'\)"):
        hf(ids[:, 8:], num_loops=3, exit_threshold=0.7, cache=fixed)
    with pytest.raises(ValueError, match=r"asks for 4 loops read out by the exit gate"):
        hf(ids[:, 8:], num_loops=4, exit_threshold=0.7, cache=gated)
    with pytest.raises(ValueError, match=r"asks for 3 loops read out by the exit gate "
                                         r"\(kv_fill 'skip'\) \(start a new cache"):
        hf(ids[:, 8:9], num_loops=3, exit_threshold=0.7, kv_fill="skip", cache=gated)


def window_generate(model, tok, spec: ExitSpec, max_new: int) -> tuple[list[str], list[list[int]]]:
    """(texts, loops per new token) of greedy decoding with loopline's adaptive readout of each
    whole window (every position runs every loop, ``adaptive_logits``): what the export's
    ``generate(use_cache=False)`` computes (cached, a token stops at its exit)."""
    eos = eos_id(tok)
    prompts = encode_prompts(tok, PROMPTS, SEQ_LEN, eos)
    loops: list[list[int]] = [[] for _ in prompts]

    def next_ids(active: list[int], rows: list[list[int]]) -> list[int]:
        ids, lengths = padded_rows(rows, eos, "cpu")
        logits, exits = adaptive_logits(model, ids, spec)
        at = torch.arange(len(rows))
        for i, n in zip(active, exits[at, lengths - 1].tolist(), strict=True):
            loops[i].append(n)
        return logits[at, lengths - 1].argmax(-1).tolist()

    done = greedy_decode(next_ids, prompts, [max_new] * len(prompts), eos_id=eos,
                         context_len=SEQ_LEN)
    return [tok.decode(new, skip_special_tokens=True) for new, _ in done], loops


@pytest.mark.slow
def test_transformers_alone_generates_with_the_gate_as_loopline_does(exports,
                                                                     tmp_path) -> None:
    """AutoModelForCausalLM (trust_remote_code, loopline not importable) on the export:
    gated logits and exit loops equal loopline's; greedy cached generate() on left-padded
    rows writes loopline's generate_texts() text, and the loops per new token read off the
    returned cache are those of loopline's cached adaptive decoding, for kv_fill latest and
    skip; use_cache=False writes the text (and forward's exit loops) of loopline's adaptive
    readout over each window; beam search and sampling run through the cache; the config
    default gives the explicit threshold's tokens."""
    model, export = exports["dense"]
    ids = _ids()
    forward, runs = [[3, 0.7], [5, 0.9]], [[4, 0.8, "latest"], [5, 0.9, "skip"]]
    request = {"exports": [{"dir": str(export), "gate": {
        "ids": ids.tolist(), "forward": forward, "prompts": PROMPTS, "generate": runs,
        "max_new": 8}}]}
    answer = run_hf_worker(request, tmp_path)
    assert answer["pipeline_lib_modules"] == []
    [got] = answer["answers"]
    for (h, t), out in zip(forward, got["forward"], strict=True):
        logits, exits = adaptive_logits(model, ids, ExitSpec((t,), "gate", h))
        assert out["exit_loops"] == exits.tolist()
        torch.testing.assert_close(torch.tensor(out["logits"]), logits, atol=1e-5, rtol=0)
    tok = byte_level_tokenizer()
    prompts = encode_prompts(tok, PROMPTS, SEQ_LEN, eos_id(tok))
    for (h, t, fill), out in zip(runs, got["generate"], strict=True):
        ours = generate_texts(model, tok, PROMPTS, context_len=SEQ_LEN, max_new_tokens=8,
                              depth=Depth(h, ExitSpec((t,), "gate", h)),
                              cache=CacheOptions(kv_fill=fill))
        assert out["texts"] == [g.text for g in ours], (h, t, fill)
        _, want, _ = library_generate(model, prompts, h, t, fill, 8, eos_id(tok))
        for mine, loops in zip(want, out["exit_loops"], strict=True):
            assert loops[:len(mine)] == mine
        every = {n for row in out["exit_loops"] for n in row}
        assert min(every) < h and max(every) == h  # exits really vary
        assert out["cache"] == ["AdaptiveKVCache", h, fill]
        texts, window_loops = window_generate(model, tok, ExitSpec((t,), "gate", h), 8)
        assert out["window_texts"] == texts, (h, t)
        for mine, loops in zip(window_loops, out["window_exit_loops"], strict=True):
            assert loops[:len(mine)] == mine
        assert out["beam_shape"][0] == out["sample_shape"][0] == len(PROMPTS)
        assert out["default_is_explicit"] is True
