"""`generate`: text from a snapshot, streamed to the terminal, or JSON lines for a batch of
prompts read from a file or stdin (see :mod:`pipeline_lib.evaluate.generation`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ..errors import UsageError
from ..spec.rules import EXIT_CRITERIA
from ._common import SNAPSHOT, TOKENIZER, Command, OneOf, arg

COMMAND = Command("generate", "generate text from a snapshot (greedy by default)", (
    SNAPSHOT,
    arg("--prompt", default=None, help="one prompt (streamed output)"),
    arg("--prompts-file", default=None, metavar="FILE",
        help="one prompt per line ('-' = stdin); .jsonl: {\"prompt\": …} per line"),
    OneOf((
        arg("--h-eff", default=None, help="test-time loops N >= 1, or adaptive:THRESHOLD[:MAX]"),
        arg("--adaptive", default=None, metavar="THRESHOLD[:MAX]",
            help="adaptive exit: a token stops looping once its next-token distribution "
                 "changes by less than THRESHOLD (KL), at most MAX loops"))),
    arg("--adaptive-criterion", default="kl", choices=list(EXIT_CRITERIA),
        help="exit score of --adaptive (default kl; gate needs a snapshot with "
             "model.exit_gate); --adaptive gate:0.9 names it too"),
    arg("--kv-share", default="per_loop", metavar="per_loop|last|every:K",
        help="KV cache across loops: one slot per loop (default, exact), only the last "
             "loop's, or one per K loops (less memory)"),
    arg("--kv-fill", default="latest", metavar="latest|skip",
        help="adaptive exit: what a later token reads of a position that stopped looping "
             "early: its last computed loop (default) or nothing (masked past its exit)"),
    arg("--continuous", action="store_true",
        help="continuous compute: a generated token starts looping from the previous "
             "token's final state instead of state_init"),
    arg("--max-new-tokens", type=int, default=64, help="per prompt (default 64)"),
    arg("--temperature", type=float, default=0.0,
        help="sampling temperature; 0 = greedy (default)"),
    arg("--top-p", type=float, default=1.0,
        help="nucleus sampling: keep the most likely tokens holding this much probability "
             "(default 1)"),
    arg("--seed", type=int, default=0, help="sampling seed (default 0)"),
    arg("--batch-size", type=int, default=16, help="prompts decoded together"),
    arg("--device", default="cpu", choices=["auto", "cpu", "cuda", "npu"],
        help="where the model runs (default cpu)"),
    arg("--use-ema", action="store_true", help="use the snapshot's EMA weights"),
    TOKENIZER),
    description="Continue --prompt (streamed to stdout) or every line of --prompts-file ('-' "
                "or piped stdin; a .jsonl file holds {\"prompt\": …} objects; one JSON line "
                "out per prompt) after --h-eff core loops (default: the training loop count) "
                "or with adaptive exits (each token's later loops are not computed). Greedy "
                "unless --temperature > 0. Each JSON line reports mean_loops (loops computed "
                "per token), kv_bytes and kv_bytes_core (its batch's KV cache, all of it and "
                "its core blocks), seconds and tokens_per_s (its batch's); a summary line of "
                "the whole run goes to stderr.")


def read_prompts(args: argparse.Namespace) -> tuple[list[str], bool]:
    """(prompts, streamed): --prompt streams; a file, '-' or piped stdin is a batch."""
    if args.prompt is not None and args.prompts_file is not None:
        raise UsageError("--prompt and --prompts-file both given; pass one")
    if args.prompt is not None:  # argv keeps undecodable bytes as surrogates: check them
        return [_utf8(os.fsencode(args.prompt), "--prompt")], True
    name = args.prompts_file
    if name is None and sys.stdin.isatty():
        raise UsageError("no prompt: pass --prompt TEXT or --prompts-file FILE, or pipe prompts "
                         "into stdin (one per line)")
    if name in (None, "-"):
        raw = getattr(sys.stdin, "buffer", None)  # a text stream in place of stdin has none
        text = _utf8(raw.read(), "stdin") if raw is not None else sys.stdin.read()
        name = "stdin"
    else:
        if Path(name).is_dir():
            raise UsageError(f"--prompts-file {name} is a directory; pass a text file with one "
                             "prompt per line (or a .jsonl file with {\"prompt\": …} per line)")
        try:
            text = _utf8(Path(name).read_bytes(), f"--prompts-file {name}")
        except OSError as exc:
            raise UsageError(f"cannot read --prompts-file {name}: {exc.strerror or exc}; pass "
                             "a readable text file with one prompt per line") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise UsageError(f"{name} holds no prompt; write one prompt per line")
    if str(name).endswith(".jsonl"):
        return [_json_prompt(name, n, line) for n, line in lines], False
    return [line for _, line in lines], False


def _utf8(data: bytes, name: str) -> str:
    """``data`` as UTF-8 text (a byte order mark, as Windows editors write, is not part of
    the first prompt); a UsageError naming ``name`` and the first bad byte otherwise."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name} is not UTF-8 text (byte {exc.start}: {exc.reason}); give "
                         "prompts as UTF-8") from None


def _json_prompt(name: str, n: int, line: str) -> str:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise UsageError(f"{name} line {n} is not valid JSON ({str(exc).splitlines()[0]}); "
                         "write {\"prompt\": \"…\"} per line") from None
    prompt = record.get("prompt") if isinstance(record, dict) else None
    if not isinstance(prompt, str):
        raise UsageError(f"{name} line {n} is not a JSON object with a \"prompt\" string; "
                         "write {\"prompt\": \"…\"} per line")
    return prompt


def run(args: argparse.Namespace) -> int:
    # torch: loads on run, `--help` stays fast
    from ..device import resolve_device
    from ..evaluate.generation import (  # torch: as above
        CacheOptions,
        Sampling,
        generate_texts,
        parse_depth,
        summary_line,
    )
    from ..evaluate.loading import load_for_eval  # torch: as above

    prompts, streamed = read_prompts(args)
    sampling = Sampling(args.temperature, args.top_p, args.seed)  # checked before loading
    cache = CacheOptions(args.kv_share, args.kv_fill, args.continuous)
    parse_depth(args.h_eff, args.adaptive, 1, args.adaptive_criterion)
    loaded = load_for_eval(args.snapshot, use_ema=args.use_ema, tokenizer=args.tokenizer,
                           tokenizer_option="--tokenizer {}")
    depth = parse_depth(args.h_eff, args.adaptive, loaded.config.model.loops,
                        args.adaptive_criterion)
    if depth.exit is not None:  # the gate criterion needs a gated snapshot
        from ..evaluate.exit.criteria import check_model_criterion  # torch: as above

        check_model_criterion(loaded.model, depth.exit.criterion, "generate --adaptive-criterion")
    model = loaded.model.to(resolve_device(args.device))

    def show(_: int, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    started = time.perf_counter()
    results = generate_texts(model, loaded.tokenizer, prompts, context_len=loaded.seq_len,
                             max_new_tokens=args.max_new_tokens, depth=depth,
                             sampling=sampling, batch_size=args.batch_size,
                             on_text=show if streamed else None, cache=cache)
    seconds = time.perf_counter() - started
    if streamed:
        sys.stdout.write("\n")
    else:
        for result in results:
            print(json.dumps(result.to_json(), ensure_ascii=False))
    print(summary_line(results, seconds, depth.loops), file=sys.stderr)
    return 0
