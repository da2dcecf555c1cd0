"""Greedy generation with the KV cache vs recomputing the whole window, side by side.

    python benchmarks/bench_generate.py [--new-tokens 64 --prompt-tokens 32 --batch 1 8 ...]

Both paths are :func:`pipeline_lib.model.generate.greedy_generate` on the same model and
prompts (``use_cache=True`` / ``False``), alternated over ``--repeats`` rounds in one
process with the same thread count (1 by default), fp32 on the CPU; each side's median is
reported, and the two must produce the same tokens. The model defaults to the project's
default architecture (``config/config.yaml``: d_model 64, 1 prelude + 1 core block, 4
loops) with a byte-level vocabulary; ``--h-eff`` reads out after another loop count and
``--d-model`` lists widths to measure (0 = the default's; heads stay at the default count).
``speedup`` = uncached / cached time per width and batch size (target: ≥ 3 for 64 new
tokens); the top-level ``speedup`` is the smallest.

``--adaptive [CRITERION:]T[:MAX]`` adds cached adaptive decoding (each token stops at its
exit, its later loops not computed; ``--kv-fill``), MAX defaulting to ``--h-eff``;
``--kv-share`` lists KV sharing settings (``last``, ``every:2``, …) to add, at fixed depth
and, with ``--adaptive``, adaptive. Every setting is timed in the same alternated rounds;
per setting a row reports its time, tokens/s, ``vs_cached`` (fixed-depth per-loop cached
time / its time), the loops computed per token and the cache's bytes (``kv_bytes``, of
the prefill's cache). Uncached and the other settings are not compared for equal tokens
(sharing and early exits change them). The last line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from pipeline_lib.diagnostics.timing import alternated
from pipeline_lib.evaluate.exit.cached import CriterionExit
from pipeline_lib.evaluate.generation import parse_depth
from pipeline_lib.model.generate import CachedNextIds, greedy_decode, greedy_generate
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.provenance import cpu_model, git_output
from pipeline_lib.spec.config import load_config

BYTE_VOCAB = 258
ROOT = Path(__file__).resolve().parents[1]


def _machine() -> str:
    return f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def settings(model: LoopedLM, args: argparse.Namespace) -> dict[str, dict]:
    """Name → options of :class:`CachedNextIds` of every extra setting (module doc)."""
    out = {f"kv_share={share}": {"kv_share": share} for share in args.kv_share}
    if args.adaptive is not None:
        spec = parse_depth(None, args.adaptive, args.h_eff).exit
        for share in ["per_loop", *args.kv_share]:
            name = "adaptive" + ("" if share == "per_loop" else f"+kv_share={share}")
            out[name] = {"kv_share": share, "kv_fill": args.kv_fill,
                         "exit_rule": CriterionExit(model, spec)}
    return out


def decode(model: LoopedLM, prompts: list, args: argparse.Namespace, context: int,
           options: dict) -> tuple[list, float, int]:
    """(tokens, loops computed per token, kv bytes) of cached decoding with ``options``."""
    nxt = CachedNextIds(model, args.h_eff, reserve=args.new_tokens, **options)
    loops: list[int] = []

    def next_ids(active: list[int], rows: list[list[int]]) -> list[int]:
        out = nxt(active, rows)
        loops.extend(nxt.loops)
        return out

    done = greedy_decode(next_ids, prompts, [args.new_tokens] * len(prompts), eos_id=None,
                         context_len=context)
    return done, sum(loops) / max(len(loops), 1), nxt.kv_bytes


def measure(model: LoopedLM, batch: int, args: argparse.Namespace) -> dict[str, float]:
    """Median seconds of each path for ``batch`` prompts, alternated; tokens checked equal."""
    gen = torch.Generator().manual_seed(batch)
    prompts = torch.randint(1, BYTE_VOCAB, (batch, args.prompt_tokens), generator=gen).tolist()
    context = args.prompt_tokens + args.new_tokens  # no sliding window: the cache's own case

    def run(use_cache: bool) -> list:
        return greedy_generate(model, prompts, args.new_tokens, h_eff=args.h_eff, eos_id=None,
                               context_len=context, use_cache=use_cache)

    reference = run(False)
    assert run(True) == reference, "cached generation differs from the uncached window"
    extra = settings(model, args)
    fns = {"cached": lambda: run(True), "uncached": lambda: run(False)}
    for name, options in extra.items():
        fns[name] = lambda options=options: decode(model, prompts, args, context, options)
    timings = alternated(fns, args.repeats, warmup=bool(extra))  # the check above warmed up
    median = timings.median()
    cached, plain = median["cached"], median["uncached"]
    row = {"d_model": model.cfg.d_model, "batch": batch, "cached_s": round(cached, 4),
           "uncached_s": round(plain, 4), "speedup": round(plain / cached, 2),
           "cached_tokens_per_s": round(batch * args.new_tokens / cached, 1)}
    if extra:
        _, _, full_bytes = decode(model, prompts, args, context, {})
        row["cached_kv_bytes"] = full_bytes
        row["settings"] = {}
        for name in extra:
            _, loops, kv_bytes = timings.last[name]
            row["settings"][name] = {
                "s": round(median[name], 4), "vs_cached": round(cached / median[name], 2),
                "tokens_per_s": round(batch * args.new_tokens / median[name], 1),
                "mean_loops": round(loops, 3), "kv_bytes": kv_bytes,
                "kv_bytes_vs_cached": round(kv_bytes / full_bytes, 4)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16],
                        help="prompts decoded together (16: bench.batch_size's default)")
    parser.add_argument("--d-model", type=int, nargs="+", default=[0],
                        help="widths to measure; 0 = the default model's")
    parser.add_argument("--h-eff", type=int, default=0, help="0 = the model's training loops")
    parser.add_argument("--adaptive", default=None, metavar="[CRITERION:]T[:MAX]",
                        help="also time cached adaptive decoding at this exit")
    parser.add_argument("--kv-share", nargs="+", default=[], metavar="SHARE",
                        help="also time these kv_share settings (last, every:K)")
    parser.add_argument("--kv-fill", default="latest", choices=["latest", "skip"],
                        help="kv_fill of --adaptive (default latest)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config().model
    cfg.vocab_size = BYTE_VOCAB
    args.h_eff = args.h_eff or cfg.loops
    default_width, rows = cfg.d_model, []
    for width in args.d_model:
        cfg.d_model = width or default_width
        torch.manual_seed(0)
        model = LoopedLM(copy.deepcopy(cfg)).eval()
        for batch in args.batch:
            row = measure(model, batch, args)
            rows.append(row)
            print(f"d_model {row['d_model']}, batch {batch}: {args.new_tokens} new tokens after "
                  f"{args.prompt_tokens}, H_eff {args.h_eff}: cached {row['cached_s']} s, "
                  f"uncached {row['uncached_s']} s → speedup {row['speedup']}×", flush=True)
            for name, cell in row.get("settings", {}).items():
                print(f"  {name}: {cell['s']} s, {cell['vs_cached']}× cached, "
                      f"{cell['mean_loops']} loops/token, KV {cell['kv_bytes_vs_cached']}× "
                      "cached", flush=True)
    cfg.d_model = default_width
    result = {"speedup": min(r["speedup"] for r in rows), "rows": rows,
              "new_tokens": args.new_tokens, "prompt_tokens": args.prompt_tokens,
              "h_eff": args.h_eff, "repeats": args.repeats, "commit": git_output(ROOT, "rev-parse", "--short", "HEAD") or "unknown",
              "machine": _machine(), "date": time.strftime("%Y-%m-%d"),
              "model": {k: getattr(cfg, k) for k in ("d_model", "n_heads", "prelude_layers",
                                                     "core_layers", "coda_layers", "loops")}}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
