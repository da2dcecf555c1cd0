"""``python -m pipeline_lib generate``: streamed greedy text of a model that learned a pattern,
batches from a file or stdin, adaptive exits, seeded sampling, and one-line errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from snapshot_helpers import SEQ_LEN, greedy_reference, train_pattern_model, write_tiny_snapshot

from pipeline_lib.cli import main
from pipeline_lib.data.tokenizer import byte_level_tokenizer
from pipeline_lib.errors import ConfigError
from pipeline_lib.evaluate.generation import Sampling, parse_depth, pick_tokens


@pytest.fixture(scope="module")
def pattern(tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    """A model that learned ``0123456789<eos>`` and its snapshot (2 training loops)."""
    tok = byte_level_tokenizer()
    model = train_pattern_model(tok)
    root = tmp_path_factory.mktemp("run")
    return model, write_tiny_snapshot(root / "snapshots" / "step_0000007", model, tok, step=7)


def _generate(capsys, snapshot: Path, *args: str) -> tuple[int, str, str]:
    code = main(["generate", "--snapshot", str(snapshot), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def _records(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_one_prompt_streams_the_greedy_continuation(capsys, pattern):
    model, snap = pattern
    code, out, _ = _generate(capsys, snap, "--prompt", "345", "--h-eff", "2")
    assert (code, out) == (0, "6789\n")  # then EOS
    tok = byte_level_tokenizer()
    for h in (1, 3):
        code, out, _ = _generate(capsys, snap, "--prompt", "0123", "--h-eff", str(h),
                                 "--max-new-tokens", "5")
        expected = greedy_reference(model, tok.encode("0123").ids, h, 5, 256)
        assert out == tok.decode(expected) + "\n"


def test_prompts_from_a_file_or_stdin_come_back_in_order(capsys, pattern, tmp_path,
                                                          monkeypatch):
    _, snap = pattern
    prompts = ["345", "0", "", "78"]
    (tmp_path / "p.txt").write_text("345\n0\n\n78\n")  # blank lines are skipped
    code, out, _ = _generate(capsys, snap, "--prompts-file", str(tmp_path / "p.txt"),
                             "--batch-size", "2", "--max-new-tokens", "5")
    records = _records(out)
    assert code == 0 and [r["prompt"] for r in records] == ["345", "0", "78"]
    assert [(r["completion"], r["stop"]) for r in records] == [
        ("6789", "eos"), ("12345", "length"), ("9", "eos")]
    assert [r["completion_ids"] for r in records][2] == [ord("9")]
    assert all(r["mean_loops"] == 2 for r in records)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    code, out, _ = _generate(capsys, snap, "--prompts-file", str(tmp_path / "p.jsonl"),
                             "--max-new-tokens", "4")
    assert [r["prompt"] for r in _records(out)] == prompts
    assert _records(out)[2]["completion"] == "0123"  # an empty prompt starts a document
    monkeypatch.setattr("sys.stdin", io.StringIO("345\n78\n"))
    code, out, _ = _generate(capsys, snap, "--max-new-tokens", "4")
    assert [r["completion"] for r in _records(out)] == ["6789", "9"]


def test_adaptive_exit_bounds(capsys, pattern):
    _, snap = pattern
    args = ["--prompts-file", "-", "--max-new-tokens", "6"]
    outputs = {}
    for depth in (["--adaptive", "0:3"], ["--h-eff", "3"], ["--h-eff", "adaptive:1e9:3"],
                  ["--h-eff", "1"], ["--adaptive", "1e9", "--adaptive-criterion", "entropy"]):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("sys.stdin", io.StringIO("0123\n56\n"))
            code, out, _ = _generate(capsys, snap, *args, *depth)
        assert code == 0
        outputs[" ".join(depth)] = _records(out)
    # threshold 0 never exits early: the fixed result at MAX, every token 3 loops deep
    timeless = [[{k: v for k, v in r.items() if k not in ("seconds", "tokens_per_s")}
                 for r in outputs[k]] for k in ("--adaptive 0:3", "--h-eff 3")]
    assert timeless[0] == [{**r, "mean_loops": 3.0} for r in timeless[1]]
    # a huge threshold exits after loop 1; MAX defaults to the training loop count (2)
    assert [r["completion_ids"] for r in outputs["--h-eff adaptive:1e9:3"]] == [
        r["completion_ids"] for r in outputs["--h-eff 1"]]
    assert all(r["mean_loops"] == 1.0 for r in outputs["--h-eff adaptive:1e9:3"])
    assert parse_depth(None, "1e9", 2, "entropy").loops == 2


def test_kv_share_and_continuous_report_their_cache_bytes(capsys, pattern):
    _, snap = pattern
    args = ["--prompts-file", "-", "--max-new-tokens", "6", "--h-eff", "3"]
    outputs = {}
    for cache in ([], ["--kv-share", "last"], ["--kv-share", "every:2"], ["--continuous"],
                  ["--adaptive", "1e9:3", "--kv-fill", "skip", "--kv-share", "last"]):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("sys.stdin", io.StringIO("0123\n56\n"))
            depth = [] if "--adaptive" in cache else args[4:]
            code, out, err = _generate(capsys, snap, *args[:4], *depth, *cache)
        assert code == 0
        outputs[" ".join(cache)] = _records(out)
        tokens = sum(len(r["completion_ids"]) for r in outputs[" ".join(cache)])
        assert err.startswith(f"generate: 2 prompt(s), {tokens} new tokens in ")
    full, last = outputs[""][0]["kv_bytes"], outputs["--kv-share last"][0]["kv_bytes"]
    # 1 prelude and 1 coda slot, a core slot per loop (3) or one shared: 5 slots → 3
    assert full > 0 and last * 5 == full * 3
    core, last_core = (outputs[k][0]["kv_bytes_core"] for k in ("", "--kv-share last"))
    assert core * 5 == full * 3 and last_core * 3 == core  # the core: exactly 1/H
    assert f"KV cache {last} bytes (core blocks {last_core})" in err  # the last run's
    for r in outputs[""]:  # the batch's wall time and its new tokens per second
        assert r["seconds"] > 0
        assert r["tokens_per_s"] == pytest.approx(
            sum(len(x["completion_ids"]) for x in outputs[""]) / r["seconds"], rel=0.02)
    assert outputs["--kv-share every:2"][0]["kv_bytes"] * 5 == full * 4
    assert all(r["mean_loops"] == 3.0 for r in outputs["--continuous"])
    adaptive = outputs["--adaptive 1e9:3 --kv-fill skip --kv-share last"]
    assert all(r["mean_loops"] == 1.0 and r["kv_bytes"] == last for r in adaptive)


def test_sampling_is_seeded_and_top_p_cuts_the_tail(capsys, pattern):
    _, snap = pattern
    hot = ["--prompt", "0", "--temperature", "50", "--max-new-tokens", "8"]
    runs = [_generate(capsys, snap, *hot, "--seed", str(s))[1] for s in (1, 1, 2)]
    assert runs[0] == runs[1] != runs[2]
    code, out, _ = _generate(capsys, snap, *hot, "--top-p", "1e-6")
    assert (code, out) == (0, "12345678\n")  # only the most likely token survives: greedy
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    gen = torch.Generator().manual_seed(0)
    drawn = {pick_tokens(logits, Sampling(1.0, top_p, 0), gen)[0]
             for top_p in (0.6,) for _ in range(200)}
    assert drawn == {0, 1}  # 0.5 + 0.3 covers 0.6; 0.2 is cut
    assert {pick_tokens(logits, Sampling(1.0, 0.5, 0), gen)[0] for _ in range(50)} == {0}


@pytest.mark.parametrize(("args", "message"), [
    (["--h-eff", "0"], "error: --h-eff '0' is not a loop count; use --h-eff N with N >= 1"),
    (["--h-eff", "four"], "error: --h-eff 'four' is not a loop count"),
    (["--h-eff", "adaptive:x"], "error: --h-eff='adaptive:x': THRESHOLD must be a number"),
    (["--adaptive", "-1"], "error: --adaptive '-1' is not [CRITERION:]THRESHOLD[:MAX]"),
    (["--adaptive", "gate:0.5"], "error: generate --adaptive-criterion: criterion gate needs a "
                                 "snapshot with the learned exit gate"),
    (["--kv-share", "every:0"], "error: --kv-share 'every:0' is not one of per_loop, last or "
                                "every:K (K >= 1)"),
    (["--kv-share", "first"], "error: --kv-share 'first' is not one of per_loop, last or every:K"),
    (["--kv-fill", "nearest"], "error: --kv-fill 'nearest' is not one of ['latest', 'skip']"),
    (["--temperature", "-1"], "error: --temperature -1.0 must be a finite number >= 0"),
    (["--top-p", "0"], "error: --top-p 0.0 must lie in (0, 1]"),
    (["--max-new-tokens", "0"], "error: --max-new-tokens 0 and --batch-size 16 must be at least 1"),
])
def test_bad_flags_are_one_line_errors(capsys, pattern, args, message):
    code, out, err = _generate(capsys, pattern[1], "--prompt", "1", *args)
    assert (code, out) == (2, "") and len(err.splitlines()) == 1 and err.startswith(message)


def test_prompt_longer_than_the_context_is_refused(capsys, pattern, tmp_path):
    code, out, err = _generate(capsys, pattern[1], "--prompt", "7" * (SEQ_LEN + 1))
    assert (code, out) == (2, "")
    assert err == (f"error: prompt 1 has {SEQ_LEN + 1} tokens but the model's context is "
                   f"{SEQ_LEN} (data.seq_len of the snapshot); shorten it to {SEQ_LEN} tokens "
                   "or fewer")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "1"}\n["not an object"]\n')
    code, _, err = _generate(capsys, pattern[1], "--prompts-file", str(tmp_path / "bad.jsonl"))
    assert code == 2 and err.startswith(f"error: {tmp_path / 'bad.jsonl'} line 2 is not a JSON "
                                        "object with a \"prompt\" string")


def test_missing_tokenizer_is_one_line(capsys, pattern, tmp_path):
    model, _ = pattern
    snap = write_tiny_snapshot(tmp_path / "snapshots" / "step_0000007", model,
                               byte_level_tokenizer(), step=7, with_tokenizer=False)
    code, _, err = _generate(capsys, snap, "--prompt", "345")
    assert code == 2 and len(err.splitlines()) == 1
    assert "has no tokenizer.json" in err and "pass --tokenizer " in err
    with pytest.raises(ConfigError, match="--h-eff and --adaptive both given"):
        parse_depth("2", "0.1", 2)


def test_prompts_begin_with_the_packs_bos_when_its_documents_do():
    from pipeline_lib.data.tokenizer import byte_level_tokenizer, set_document_start
    from pipeline_lib.evaluate.generation import encode_prompts

    tok = byte_level_tokenizer()
    assert encode_prompts(tok, ["ab", ""], 16, eos=256) == [[97, 98], [256]]
    tok.add_special_tokens(["<s>"])
    bos = tok.token_to_id("<s>")
    set_document_start(tok, bos)
    assert encode_prompts(tok, ["ab", ""], 16, eos=256) == [[bos, 97, 98], [bos]]
