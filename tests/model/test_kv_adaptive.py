"""Cached adaptive decoding: per-token exits, later loops not computed, ``kv_fill``, and
continuous compute (fp32, CPU)."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.evaluate.exit.cached import CriterionExit
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.model.generate import CachedNextIds, greedy_decode
from pipeline_lib.model.looped import LoopedLM

H = 4
PROMPTS = [[3, 4, 5, 6, 7, 8], [9, 8, 7], [11, 2, 30, 4]]
NEVER = [("kl", 0.0), ("entropy", 0.0), ("latent_diff", 0.0), ("cosine", 0.0),
         ("argmax_stable", 0.0)]


def _model(make_config, **overrides) -> LoopedLM:
    torch.manual_seed(7)
    return LoopedLM(make_config(init_std=0.3, core_layers=2, **overrides)).eval()


def _run(model: LoopedLM, h_eff: int, new: int = 7, rule=None, **options):
    """(tokens per prompt, logits of every call, loops of every call, the next_ids)."""
    nxt = CachedNextIds(model, h_eff, exit_rule=rule, **options)
    logits, loops = [], []

    def next_ids(active, rows):
        out = nxt.logits(active, rows)
        logits.append(out)
        loops.append(list(nxt.loops))
        return out.argmax(-1).tolist()

    done = greedy_decode(next_ids, PROMPTS, [new, 3, new], eos_id=None, context_len=64)
    return done, logits, loops, nxt


@pytest.mark.parametrize(("criterion", "threshold"), NEVER)
@pytest.mark.parametrize(("share", "continuous"), [("per_loop", False), ("last", False),
                                                   ("every:3", True)])
def test_a_threshold_that_never_exits_is_fixed_depth_cached_decoding(
        make_config, criterion: str, threshold: float, share: str, continuous: bool) -> None:
    model = _model(make_config)
    fixed = _run(model, H, kv_share=share, continuous=continuous)
    rule = CriterionExit(model, ExitSpec((threshold,), criterion, H))
    adaptive = _run(model, 99, rule=rule, kv_share=share, continuous=continuous,
                    kv_fill="skip")
    assert adaptive[0] == fixed[0]
    for a, b in zip(adaptive[1], fixed[1], strict=True):  # fp32: matmul shapes differ
        assert (a - b).abs().max() <= 1e-5
    assert all(n == H for call in adaptive[2] for n in call)
    assert adaptive[3].kv_bytes == fixed[3].kv_bytes


@pytest.mark.parametrize("fill", ["latest", "skip"])
def test_tokens_that_exit_after_one_loop_decode_like_one_loop(make_config, fill: str) -> None:
    """Without coda, a token that exits at loop 1 reads only loop-1 keys and values:
    every token exiting there (a KL threshold no score reaches) is fixed depth 1."""
    model = _model(make_config, coda_layers=0)
    one = _run(model, 1)
    rule = CriterionExit(model, ExitSpec((1e9,), "kl", H))
    adaptive = _run(model, H, rule=rule, kv_fill=fill)
    assert adaptive[0] == one[0]
    for a, b in zip(adaptive[1], one[1], strict=True):
        assert (a - b).abs().max() <= 1e-6
    assert all(n == 1 for call in adaptive[2] for n in call)
    cache, P, C = adaptive[3].cache, model.cfg.prelude_layers, model.cfg.core_layers
    cols = cache.lengths - 1  # each row's last decoded token
    rows = torch.arange(cache.rows)
    assert torch.equal(cache.reached[rows, cols], torch.ones_like(cols))
    for t in range(1, H):  # loops 2..H: the loop-1 copy (latest) or never written (skip)
        for j in range(C):
            deep, first = cache.keys[P + t * C + j], cache.keys[P + j]
            want = first[rows, :, cols] if fill == "latest" else torch.zeros_like(
                first[rows, :, cols])
            assert torch.equal(deep[rows, :, cols], want)


def test_skip_masks_a_position_past_its_exit_and_latest_does_not(make_config) -> None:
    model = _model(make_config)
    outs = {}
    for fill in ("latest", "skip"):  # tokens exit at loop 3 or 4: loop 4 reads past exits
        rule = CriterionExit(model, ExitSpec((2.0,), "argmax_stable", H))
        _, logits, _, nxt = _run(model, H, rule=rule, kv_fill=fill)
        outs[fill] = logits
        cache = nxt.cache
        with torch.inference_mode():
            cache.begin_step()
            cache.enter("loop", 3)
        used = cache._mask.shape[-1]
        early = cache.reached[:, :used] < H  # [B, columns] tokens that exited before loop 4
        assert early.any()
        masked = cache._mask[:, 0, 0] == float("-inf")
        assert torch.equal(masked & early, early if fill == "skip" else torch.zeros_like(early))
        assert not masked[:, 0].any()  # the prompt was computed at every loop
    assert torch.equal(outs["latest"][0], outs["skip"][0])  # the prompt is shared
    assert any(not torch.allclose(a, b) for a, b in zip(outs["latest"], outs["skip"],
                                                        strict=True))


def test_mixed_exits_count_the_loops_computed(make_config) -> None:
    model = _model(make_config)
    rule = CriterionExit(model, ExitSpec((2.0,), "argmax_stable", H))
    done, _, loops, _ = _run(model, H, rule=rule)
    flat = [n for call in loops for n in call]
    assert set(flat) <= {3, 4} and 3 in flat  # argmax_stable 2: the earliest exit is loop 3
    assert [len(new) for new, _ in done] == [7, 3, 7]


def test_continuous_compute_starts_from_the_previous_final_state(make_config) -> None:
    model = _model(make_config, state_init="zeros")
    ids = torch.tensor([PROMPTS[0]])
    with torch.inference_mode():
        ctx = model.embed(ids)
        want = model.forward_loops(ctx, 0, H)[0, -1]
        logits, cache = model.prefill(ids, H, continuous=True)
        assert torch.allclose(cache.last_state[0], want, atol=1e-6)
        _, plain = model.prefill(ids, H)
        token = logits.argmax(-1)
        cont, fresh = model.decode_step(cache, token), model.decode_step(plain, token)
    assert not torch.allclose(cont, fresh)
    assert plain.last_state is None and cache.last_state.shape == (1, model.cfg.d_model)


class _FullReadout:
    """``rule`` scored as before readouts were computed on demand: the whole readout (coda,
    norm, head) of every looping row after every loop."""

    reads = "logits"

    def __init__(self, rule: CriterionExit) -> None:
        self.rule, self.max_loops = rule, rule.max_loops

    def start(self, state, readout):
        self.rule.start(state, readout)

    def exited(self, state, hidden, logits):
        return self.rule.exited(state, hidden, logits)

    def keep(self, still):
        self.rule.keep(still)


@pytest.mark.parametrize(("criterion", "reads"), [("latent_diff", "state"), ("cosine", "state"),
                                                  ("gate", "hidden")])
@pytest.mark.parametrize("fill", ["latest", "skip"])
def test_a_readout_computed_only_where_the_criterion_reads_it_changes_nothing(
        make_config, criterion: str, reads: str, fill: str) -> None:
    """State criteria read nothing out before a row exits, the gate no head: the same
    tokens, logits and loops as the whole readout after every loop, prompt included."""
    model = _model(make_config, exit_gate=criterion == "gate", coda_layers=2)
    for threshold in (0.01, 0.02, 0.32, 0.35, 0.4, 0.6, 0.8):
        rule = CriterionExit(model, ExitSpec((threshold,), criterion, H))
        assert rule.reads == reads
        lean = _run(model, 99, rule=rule, kv_fill=fill)
        calls = [n for call in lean[2] for n in call]
        if min(calls) < H == max(calls):
            break
    else:
        pytest.fail(f"no threshold of {criterion} mixes early exits with full depth")
    full = _run(model, 99, rule=_FullReadout(CriterionExit(model, ExitSpec((threshold,),
                                                                           criterion, H))),
                kv_fill=fill)
    assert lean[0] == full[0] and lean[2] == full[2]
    for a, b in zip(lean[1], full[1], strict=True):
        assert (a - b).abs().max() <= 1e-5
