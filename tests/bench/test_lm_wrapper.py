"""LooplineLM against direct computations on the model: log-likelihoods, greediness, generation."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from snapshot_helpers import (
    PATTERN,
    SEQ_LEN,
    direct_continuation_logprob,
    direct_logprobs,
    greedy_reference,
    tiny_model_config,
    write_tiny_snapshot,
)

from pipeline_lib.bench import LooplineLM
from pipeline_lib.bench.lm_wrapper import score_windows
from pipeline_lib.errors import CheckpointError, ConfigError
from pipeline_lib.evaluate.exit.cached import CriterionExit
from pipeline_lib.evaluate.exit.criteria import adaptive_logits
from pipeline_lib.evaluate.exit.spec import ExitSpec
from pipeline_lib.model.generate import CachedNextIds, greedy_decode


def ll_request(context: str, continuation: str) -> Instance:
    return Instance("loglikelihood", {}, (context, continuation), 0)


def gen_request(context: str, **gen_kwargs) -> Instance:
    return Instance("generate_until", {}, (context, gen_kwargs), 0)


def direct_windows_logprob(model, prefix: int, tokens: list[int], h_eff: int) -> float:
    """Reference for long texts: lm-eval's own rolling windows, scored on the model."""
    total = 0.0
    for window in get_rolling_token_windows(tokens, prefix, SEQ_LEN, 1):
        context, targets = make_disjoint_window(window)  # as lm-eval's HF model scores them
        total += direct_continuation_logprob(model, context, targets, h_eff)
    return total


@pytest.fixture(scope="module")
def random_model():
    from pipeline_lib.model.looped import LoopedLM

    # Untied head and larger weights: predictions that depend on more than the last token.
    torch.manual_seed(1)
    return LoopedLM(replace(tiny_model_config(), tie_embeddings=False, init_std=0.2)).eval()


def make_lm(model, tokenizer, **kwargs) -> LooplineLM:
    kwargs.setdefault("h_eff", 2)
    return LooplineLM(model=model, tokenizer=tokenizer, seq_len=SEQ_LEN, **kwargs)


# ------------------------------------------------------------------ loglikelihood


@pytest.mark.parametrize("h_eff", [1, 3])
def test_loglikelihood_equals_direct_sum_of_token_logprobs(random_model, tokenizer, h_eff):
    pairs = [("0123", "456"), ("a=7;b=a;print(b)=", "7"),
             ("x" * 40 + "long context", " tail"),  # 52 + 5 tokens > SEQ_LEN: left-truncated
             ("parity(1011)=", "1")]
    enc = lambda s: tokenizer.encode(s).ids  # noqa: E731
    for batch_size in (1, 3):
        lm = make_lm(random_model, tokenizer, h_eff=h_eff, batch_size=batch_size)
        got = lm.loglikelihood([ll_request(c, x) for c, x in pairs], disable_tqdm=True)
        for (ctx, cont), (logprob, _) in zip(pairs, got, strict=True):
            want = direct_continuation_logprob(random_model, enc(ctx), enc(cont), h_eff)
            assert logprob == pytest.approx(want, abs=1e-5)


def test_loglikelihood_depends_on_h_eff(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, h_eff=1)
    one = lm.loglikelihood([ll_request("0123", "456")], disable_tqdm=True)[0][0]
    lm.h_eff = 4
    four = lm.loglikelihood([ll_request("0123", "456")], disable_tqdm=True)[0][0]
    assert abs(one - four) > 1e-4
    assert four == pytest.approx(direct_continuation_logprob(
        random_model, tokenizer.encode("0123").ids, tokenizer.encode("456").ids, 4), abs=1e-5)


def test_empty_context_is_conditioned_on_eos(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer)
    (logprob, _), = lm.loglikelihood([ll_request("", "0123")], disable_tqdm=True)
    want = direct_continuation_logprob(random_model, [lm.eot_token_id],
                                       tokenizer.encode("0123").ids, 2)
    assert logprob == pytest.approx(want, abs=1e-5)


def test_long_continuation_and_rolling_match_lm_eval_windows(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, batch_size=2)
    text = PATTERN * 5 + "tail"  # 54 tokens: three windows of SEQ_LEN
    tokens = tokenizer.encode(text).ids
    (logprob, _), = lm.loglikelihood([ll_request("0", text)], disable_tqdm=True)
    assert logprob == pytest.approx(
        direct_windows_logprob(random_model, tokenizer.encode("0").ids[0], tokens, 2), abs=1e-5)
    rolling = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)],
                                       disable_tqdm=True)
    assert rolling[0] == pytest.approx(
        direct_windows_logprob(random_model, lm.eot_token_id, tokens, 2), abs=1e-5)


def test_score_windows_cover_every_target_once():
    ctx, cont = [1, 2, 3], list(range(10, 60))
    windows = score_windows(ctx, cont, 16)
    assert [t for _, targets in windows for t in targets] == cont
    tokens = ctx + cont
    for inputs, targets in windows:
        assert 1 <= len(inputs) <= 16 and len(targets) <= len(inputs)
        end = tokens.index(targets[-1])
        assert inputs == tokens[end - len(inputs):end]  # the tokens right before the last target


def test_is_greedy(trained_model, tokenizer):
    lm = make_lm(trained_model, tokenizer)
    enc = lambda s: tokenizer.encode(s).ids  # noqa: E731
    argmax = direct_logprobs(trained_model, enc("3456789")[:-1], 2).argmax(-1).tolist()
    assert argmax[2:] == enc("6789")[:-1] + [enc("9")[0]]  # the model did learn the pattern
    got = lm.loglikelihood([ll_request("345", "6789"), ll_request("345", "6780"),
                            ll_request("345", "5")], disable_tqdm=True)
    assert [greedy for _, greedy in got] == [True, False, False]
    assert got[0][0] > got[1][0]


# ------------------------------------------------------------------ generation


def test_generation_is_greedy_and_stops_at_eos(trained_model, tokenizer):
    lm = make_lm(trained_model, tokenizer, batch_size=2)
    eos = lm.eot_token_id
    prompts = ["345678", "0", "12", PATTERN * 3 + "0123"]  # the last is longer than SEQ_LEN
    got = lm.generate_until([gen_request(p, until=[], max_gen_toks=12) for p in prompts],
                            disable_tqdm=True)
    want = [tokenizer.decode(greedy_reference(trained_model, tokenizer.encode(p).ids, 2, 12, eos))
            for p in prompts]
    assert got == want
    assert got == ["9", "123456789", "3456789", "456789"]  # EOS ends each pattern


def test_generation_left_truncates_to_seq_len(random_model, tokenizer):
    lm = make_lm(random_model, tokenizer, h_eff=3, batch_size=3)
    prompts = ["qwertyuiopasdfghjklzxcvbnm1234567890", "short", "a=1;" * 6]  # 36 > SEQ_LEN
    got = lm.generate_until([gen_request(p, until=[], max_gen_toks=6) for p in prompts],
                            disable_tqdm=True)
    want = [tokenizer.decode(greedy_reference(random_model, tokenizer.encode(p).ids, 3, 6,
                                              lm.eot_token_id)) for p in prompts]
    assert got == want


def test_generation_stops_at_stop_strings(trained_model, tokenizer):
    lm = make_lm(trained_model, tokenizer, batch_size=2)
    got = lm.generate_until([
        gen_request("0", until=["5"], max_gen_toks=12),
        gen_request("0", until=["56", "3"], max_gen_toks=12),  # the earliest stop wins
        gen_request("0", until="4", max_gen_toks=12),  # a bare string
        gen_request("0", until=["x"], max_gen_toks=12),  # never produced: EOS ends it
    ], disable_tqdm=True)
    assert got == ["1234", "12", "123", "123456789"]


def test_generation_respects_max_gen_toks(trained_model, tokenizer):
    lm = make_lm(trained_model, tokenizer, max_gen_toks=5)
    got = lm.generate_until([gen_request("0", until=[], max_gen_toks=3),
                             gen_request("0", until=[], max_gen_toks=0),
                             gen_request("0", until=[])], disable_tqdm=True)  # model default
    assert got == ["123", "", "12345"]


# ------------------------------------------------------------------ construction and errors


def test_snapshot_construction_matches_in_process_model(snapshot_dir, trained_model, tokenizer):
    lm = LooplineLM.create_from_arg_string(f"snapshot={snapshot_dir},h_eff=3,batch_size=4")
    assert (lm.step, lm.h_eff, lm.batch_size, lm.seq_len) == (7, 3, 4, SEQ_LEN)
    ref = make_lm(trained_model, tokenizer, h_eff=3)
    req = [ll_request("0123", "4567")]
    assert lm.loglikelihood(req, disable_tqdm=True)[0][0] == pytest.approx(
        ref.loglikelihood(req, disable_tqdm=True)[0][0], abs=1e-6)
    default = LooplineLM.create_from_arg_string(f"snapshot={snapshot_dir}")
    assert default.h_eff == tiny_model_config().loops


def test_use_ema_reads_the_ema_weights(trained_model, tokenizer, tmp_path):
    import copy

    from pipeline_lib.checkpoint.snapshot import write_snapshot

    ema_model = copy.deepcopy(trained_model)
    with torch.no_grad():
        for p in ema_model.parameters():
            p.mul_(0.9)
    plain = write_tiny_snapshot(tmp_path / "step_0000003", trained_model, tokenizer, step=3)
    with_ema = write_snapshot(
        tmp_path / "step_0000004", model_state=trained_model.state_dict(), optimizer_state={},
        trainer_state={"step": 4}, rng_state={}, config_yaml=(plain / "config.yaml").read_text(),
        extra_tensors={"ema": ema_model.state_dict()},
        extra_files={"tokenizer.json": tokenizer.to_str()})
    req = [ll_request("0123", "4567")]
    for use_ema, reference in (("false", trained_model), ("true", ema_model)):
        lm = LooplineLM.create_from_arg_string(f"snapshot={with_ema},h_eff=2,use_ema={use_ema}")
        want = make_lm(reference, tokenizer).loglikelihood(req, disable_tqdm=True)[0][0]
        assert lm.loglikelihood(req, disable_tqdm=True)[0][0] == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize("args, error, words", [
    ("h_eff=2", ConfigError, "snapshot=DIR"),
    ("snapshot=/nonexistent/step_0000001,h_eff=2", CheckpointError, "/nonexistent/step_0000001"),
    ("snapshot={snap},h_eff=0", ConfigError, "h_eff=0"),
    ("snapshot={snap},h_eff=two", ConfigError, "h_eff='two'"),
    ("snapshot={snap},h_eff=2,temperature=1", ConfigError, "temperature"),
    ("snapshot={snap},use_ema=true", CheckpointError, "'ema'"),
    ("snapshot={snap},kv_share=every:0", ConfigError,
     "loopline model_args kv_share='every:0' is not one of per_loop, last or every:K"),
    ("snapshot={snap},kv_share=first", ConfigError, "loopline model_args kv_share='first'"),
    ("snapshot={snap},kv_fill=zero", ConfigError,
     "loopline model_args kv_fill='zero' is not one of ['latest', 'skip']"),
])
def test_bad_model_args_give_one_line_errors(snapshot_dir, args, error, words):
    with pytest.raises(error) as info:
        LooplineLM.create_from_arg_string(args.format(snap=snapshot_dir))
    assert words in str(info.value) and "\n" not in str(info.value)


def test_bad_model_args_through_simple_evaluate(snapshot_dir):
    import lm_eval

    with pytest.raises(ConfigError, match="h_eff=0"):
        lm_eval.simple_evaluate(model="loopline", model_args=f"snapshot={snapshot_dir},h_eff=0",
                                tasks=["loopline_parity"])


# ------------------------------------------------------------------ adaptive exit


def adaptive_reference(model, ctx: list[int], cont: list[int], threshold: float, max_loops: int,
                       criterion: str = "kl") -> tuple[float, list[int]]:
    """(Σ log p(cont | ctx), exit loop of each continuation token), each position read out at
    its own adaptive exit; the request fits one window."""
    tokens = ctx + cont
    logits, exits = adaptive_logits(model, torch.tensor([tokens[:-1]]),
                                    ExitSpec((threshold,), criterion, max_loops))
    logp = torch.log_softmax(logits[0].double(), dim=-1)
    first = len(ctx)
    return (float(sum(logp[i - 1, tokens[i]] for i in range(first, len(tokens)))),
            [int(exits[0, i - 1]) for i in range(first, len(tokens))])


def task_request(kind: str, args: tuple, task: str) -> Instance:
    return Instance(kind, {}, args, 0, metadata=(task, 0, 1))


@pytest.mark.parametrize("criterion", ["kl", "entropy"])
def test_adaptive_loglikelihood_reads_each_token_at_its_exit(random_model, tokenizer,
                                                             criterion):
    threshold = 0.05 if criterion == "kl" else 4.85
    pairs = [("0123", "456"), ("a=7;b=a;print(b)=", "7"), ("parity(1011)=", "1")]
    enc = lambda s: tokenizer.encode(s).ids  # noqa: E731
    lm = make_lm(random_model, tokenizer, h_eff=f"adaptive:{threshold}:5", batch_size=2,
                 adaptive_criterion=criterion)
    assert lm.h_eff == f"adaptive:{threshold:g}:5" and lm.adaptive == ExitSpec((threshold,), criterion, 5)
    got = lm.loglikelihood([task_request("loglikelihood", p, "a" if i else "b")
                            for i, p in enumerate(pairs)], disable_tqdm=True)
    loops = {"a": [], "b": []}
    for i, ((ctx, cont), (logprob, _)) in enumerate(zip(pairs, got, strict=True)):
        want, exits = adaptive_reference(random_model, enc(ctx), enc(cont), threshold, 5,
                                         criterion)
        assert logprob == pytest.approx(want, abs=1e-5)
        loops["a" if i else "b"] += exits
    assert lm.mean_loops == {task: sum(v) / len(v) for task, v in loops.items()}
    assert len({x for v in loops.values() for x in v}) > 1  # tokens exit at different loops
    info = lm.get_model_info()
    assert info["mean_loops"] == lm.mean_loops and info["adaptive_criterion"] == criterion
    lm.reset_loop_stats()
    assert lm.mean_loops == {}


def test_h_eff_names_the_gate_criterion_and_needs_a_gated_model(random_model, tokenizer):
    from pipeline_lib.model.looped import LoopedLM

    with pytest.raises(ConfigError, match="criterion gate needs a snapshot with the learned"):
        make_lm(random_model, tokenizer, h_eff="adaptive:gate:0.5:4")
    torch.manual_seed(2)
    gated = LoopedLM(replace(tiny_model_config(), exit_gate=True, init_std=0.2)).eval()
    with torch.no_grad():
        gated.exit_gate.weight.normal_(std=2.0)
    lm = make_lm(gated, tokenizer, h_eff="adaptive:gate:0.5:4")
    assert lm.h_eff == "adaptive:gate:0.5:4" and lm.adaptive == ExitSpec((0.5,), "gate", 4)
    pairs = [("0123", "456"), ("a=7;b=a;print(b)=", "7")]
    enc = lambda s: tokenizer.encode(s).ids  # noqa: E731
    got = lm.loglikelihood([task_request("loglikelihood", p, "a") for p in pairs],
                           disable_tqdm=True)
    for (ctx, cont), (logprob, _) in zip(pairs, got, strict=True):
        want, _ = adaptive_reference(gated, enc(ctx), enc(cont), 0.5, 4, "gate")
        assert logprob == pytest.approx(want, abs=1e-5)
    lm.h_eff = "adaptive:0.05:4"  # no criterion named: back to the model_args default
    assert lm.adaptive == ExitSpec((0.05,), "kl", 4)
    with pytest.raises(ConfigError, match=r"\[0, 1\]"):
        lm.h_eff = "adaptive:gate:1.5"


def test_adaptive_ends_equal_fixed_depths(random_model, tokenizer):
    reqs = [ll_request("0123", "456"), ll_request("x" * 40 + "long context", " tail")]
    fixed = {h: make_lm(random_model, tokenizer, h_eff=h).loglikelihood(reqs, disable_tqdm=True)
             for h in (1, 4)}
    never = make_lm(random_model, tokenizer, h_eff="adaptive:0:4")
    assert never.loglikelihood(reqs, disable_tqdm=True) == fixed[4]
    assert never.mean_loops == {"unknown": 4.0}
    always = make_lm(random_model, tokenizer, h_eff="adaptive:1e9:4")
    assert always.loglikelihood(reqs, disable_tqdm=True) == fixed[1]
    assert always.mean_loops == {"unknown": 1.0}
    rolling = Instance("loglikelihood_rolling", {}, ("0123456789" * 4,), 0)
    assert (always.loglikelihood_rolling([rolling], disable_tqdm=True)
            == make_lm(random_model, tokenizer, h_eff=1).loglikelihood_rolling(
                [rolling], disable_tqdm=True))


def test_adaptive_generation(trained_model, tokenizer):
    prompts = ["345678", "0", "12"]
    reqs = [task_request("generate_until", (p, {"until": [], "max_gen_toks": 12}), "gen")
            for p in prompts]
    for h_eff, fixed in (("adaptive:0:3", 3), ("adaptive:1e9:3", 1)):
        lm = make_lm(trained_model, tokenizer, h_eff=h_eff, batch_size=2)
        got = lm.generate_until(reqs, disable_tqdm=True)
        assert got == make_lm(trained_model, tokenizer, h_eff=fixed).generate_until(
            reqs, disable_tqdm=True)
        assert lm.mean_loops == {"gen": float(fixed)}
    lm = make_lm(trained_model, tokenizer, h_eff="adaptive:0.01:3")
    assert lm.generate_until(reqs, disable_tqdm=True) == ["9", "123456789", "3456789"]
    assert 1.0 <= lm.mean_loops["gen"] <= 3.0


def test_adaptive_generation_decodes_through_the_cache_as_generate_does(random_model,
                                                                        tokenizer):
    """Generative requests under adaptive exit are loopline's cached adaptive decoding: the
    texts and the loops computed per token of ``CachedNextIds`` with the criterion's rule
    (a token's later loops are never computed)."""
    prompts = ["a=7;b=a;print(b)=", "0", "x=12;y=3;"]
    lm = make_lm(random_model, tokenizer, h_eff="adaptive:0.05:5", batch_size=3)
    got = lm.generate_until([task_request("generate_until", (p, {"until": [],
                                                                 "max_gen_toks": 10}), "gen")
                             for p in prompts], disable_tqdm=True)
    eos = lm.eot_token_id
    nxt = CachedNextIds(random_model, 5, pad_id=eos, exit_rule=CriterionExit(
        random_model, ExitSpec((0.05,), "kl", 5)))
    loops: list[int] = []

    def next_ids(active, rows):
        out = nxt(active, rows)
        loops.extend(nxt.loops)
        return out

    with torch.inference_mode():
        done = greedy_decode(next_ids, [lm.tok_encode(p) for p in prompts], [10] * 3,
                             eos_id=eos, context_len=SEQ_LEN)
    assert got == [lm.tok_decode(new) for new, _ in done]
    assert lm.mean_loops == {"gen": pytest.approx(sum(loops) / len(loops))}
    assert 1 < sum(loops) / len(loops) < 5  # the exits vary


@pytest.mark.parametrize("share, fill", [("last", "latest"), ("per_loop", "skip"),
                                         ("every:2", "skip")])
def test_generation_keeps_its_cache_as_kv_share_and_kv_fill_say(random_model, tokenizer,
                                                                 share, fill):
    """``kv_share``/``kv_fill`` reach generative requests' cache: the texts and loops of
    ``CachedNextIds`` with the same options, its core bytes (``last``: 1/5 of ``per_loop``'s
    at 5 loops), and texts that differ from the defaults' (so an ignored option fails)."""
    prompts = ["a=7;b=a;print(b)=", "0", "x=12;y=3;"]
    reqs = [task_request("generate_until", (p, {"until": [], "max_gen_toks": 10}), "gen")
            for p in prompts]
    default = make_lm(random_model, tokenizer, h_eff="adaptive:0.05:5", batch_size=3)
    lm = make_lm(random_model, tokenizer, h_eff="adaptive:0.05:5", batch_size=3,
                 kv_share=share, kv_fill=fill)
    got, plain = lm.generate_until(reqs, disable_tqdm=True), default.generate_until(
        reqs, disable_tqdm=True)
    eos = lm.eot_token_id
    nxt = CachedNextIds(random_model, 5, pad_id=eos, exit_rule=CriterionExit(
        random_model, ExitSpec((0.05,), "kl", 5)), kv_share=share, kv_fill=fill)
    with torch.inference_mode():
        done = greedy_decode(nxt, [lm.tok_encode(p) for p in prompts], [10] * 3, eos_id=eos,
                             context_len=SEQ_LEN)
    assert got == [lm.tok_decode(new) for new, _ in done]
    assert got != plain
    core = lm.loops_used.cache_bytes("gen")["kv_bytes_core"]
    full = default.loops_used.cache_bytes("gen")["kv_bytes_core"]
    assert core * {"last": 5, "per_loop": 1, "every:2": 5 / 3}[share] == pytest.approx(full)


def test_adaptive_mean_loops_per_task_through_simple_evaluate(trained_model, tokenizer,
                                                               small_bench, tmp_path):
    import lm_eval

    from pipeline_lib.bench.runner import task_manager_for
    from pipeline_lib.bench.tasks import write_builtin_tasks

    write_builtin_tasks(small_bench, tmp_path)
    tasks = ["loopline_parity", "loopline_khop"]
    manager = task_manager_for(tasks, tmp_path)
    lm = make_lm(trained_model, tokenizer, h_eff="adaptive:0.01:3", batch_size=4)
    results = lm_eval.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, limit=3)
    loops = results["config"]["mean_loops"]
    assert set(loops) == set(tasks) and all(1.0 <= x <= 3.0 for x in loops.values())
    assert results["config"]["h_eff"] == "adaptive:0.01:3"


def test_adaptive_max_defaults_to_the_training_loops(snapshot_dir):
    lm = LooplineLM.create_from_arg_string(f"snapshot={snapshot_dir},h_eff=adaptive:0.01")
    loops = tiny_model_config().loops
    assert lm.h_eff == f"adaptive:0.01:{loops}" and lm.adaptive == ExitSpec((0.01,), "kl", loops)
    lm.h_eff = 3  # back to a fixed depth
    assert (lm.h_eff, lm.adaptive) == (3, None)


@pytest.mark.parametrize("args, words", [
    ("h_eff=adaptive:x", "h_eff='adaptive:x'"),
    ("h_eff=adaptive:-0.1:4", "h_eff='adaptive:-0.1:4'"),
    ("h_eff=adaptive:0.1:0", "MAX must be at least 1"),
    ("h_eff=adaptive", "h_eff='adaptive'"),
    ("h_eff=adaptive:0.1,adaptive_criterion=margin", "adaptive_criterion='margin'"),
])
def test_bad_adaptive_model_args_give_one_line_errors(snapshot_dir, args, words):
    with pytest.raises(ConfigError) as info:
        LooplineLM.create_from_arg_string(f"snapshot={snapshot_dir},{args}")
    message = str(info.value)
    assert words in message and "\n" not in message and message.startswith("loopline model_args")
    assert "adaptive:THRESHOLD" in message or "adaptive_criterion" in message
