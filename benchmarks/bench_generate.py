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
tokens); the top-level ``speedup`` is the smallest. The last line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

from pipeline_lib.model.generate import greedy_generate
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.provenance import cpu_model, git_output
from pipeline_lib.spec.config import load_config

BYTE_VOCAB = 258
ROOT = Path(__file__).resolve().parents[1]


def _machine() -> str:
    return f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


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
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.repeats):
        for use_cache in ((True, False) if r % 2 == 0 else (False, True)):
            start = time.perf_counter()
            run(use_cache)
            times[use_cache].append(time.perf_counter() - start)
    cached, plain = statistics.median(times[True]), statistics.median(times[False])
    return {"d_model": model.cfg.d_model, "batch": batch, "cached_s": round(cached, 4), "uncached_s": round(plain, 4),
            "speedup": round(plain / cached, 2),
            "cached_tokens_per_s": round(batch * args.new_tokens / cached, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16],
                        help="prompts decoded together (16: bench.batch_size's default)")
    parser.add_argument("--d-model", type=int, nargs="+", default=[0],
                        help="widths to measure; 0 = the default model's")
    parser.add_argument("--h-eff", type=int, default=0, help="0 = the model's training loops")
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
