"""Greedy generation with the KV cache vs recomputing the whole window, side by side; with
``--snapshot``, everything issue 31's targets ask of cached adaptive decoding in one run.

    python benchmarks/bench_generate.py [--new-tokens 64 --prompt-tokens 32 --batch 1 16 ...]
    python benchmarks/bench_generate.py --snapshot results/loop4/snapshots/final \\
        --thresholds 0.001 0.01 0.1 --kv-share last [--adaptive 0.01] [--batch 1 16]

Both paths are :func:`pipeline_lib.model.generate.greedy_generate` on the same model and
prompts (``use_cache=True`` / ``False``), alternated over ``--repeats`` rounds in one
process with the same thread count (1 by default), fp32 on the CPU; each side's median is
reported, and the two must produce the same tokens. The model defaults to the project's
default architecture (``config/config.yaml``: d_model 64, 1 prelude + 1 core block, 4
loops) with a byte-level vocabulary and random prompts; ``--h-eff`` reads out after another
loop count and ``--d-model`` lists widths to measure (0 = the default's; heads stay at the
default count). ``speedup`` = uncached / cached time per width and batch size (target: ≥ 3
for 64 new tokens); the top-level ``speedup`` is the smallest.

``--adaptive [CRITERION:]T[:MAX]`` adds cached adaptive decoding (each token stops at its
exit, its later loops not computed; ``--kv-fill``), MAX defaulting to ``--h-eff``;
``--kv-share`` lists KV sharing settings (``last``, ``every:2``, …) to add, at fixed depth
and, with ``--adaptive``, adaptive. Every setting is timed in the same alternated rounds;
per setting a row reports its time, tokens/s, ``vs_cached`` (fixed-depth per-loop cached
time / its time = its tokens/s / fixed cached tokens/s at MAX), the loops computed per token
(and over MAX), the loops per decoding pass (``pass_loops``: a batch decodes in step, so a
pass runs until its deepest row exits) with ``block_bound`` (fixed depth's attention-block
calls per pass over the adaptive pass's: what early exit can gain at most while a call costs
the same for one row or sixteen, a small model's case) and the cache's bytes, all slots and
the core blocks' (``kv_bytes``, ``kv_bytes_core``, the largest cache of the run). Uncached
and the other settings are not compared for equal tokens (sharing and early exits change
them).

``--snapshot DIR`` (e.g. the demo's ``results/loop4/snapshots/final``) measures a trained
model instead: H_eff defaults to its training loops (MAX), prompts are the built-in
reasoning problems of its ``bench`` settings (``--task``, by default the first built-in task
of its ``bench.tasks``, ``loopline_khop`` for the demo; ``--examples`` per level), and
before the timing every setting answers them greedily (:mod:`pipeline_lib.bench.answer_check`:
exact match, paired on the same examples against fixed depth at MAX with ``per_loop``:
accuracy [95% Wilson interval], difference [95% paired-bootstrap interval]). With
``--thresholds`` the adaptive exit timed is the one :func:`~pipeline_lib.bench.answer_check.
pick_threshold` picks: the fewest loops computed per token whose accuracy lies inside the
interval of fixed depth at MAX (``--adaptive`` names one directly). The timing decodes
``--new-tokens`` after each prompt without stopping at EOS (every setting the same tokens).
The ``targets`` block puts side by side what the issue's targets compare: per batch size
tokens/s of adaptive vs fixed cached at MAX, loops computed per token / MAX, loops per
pass / MAX and the block bound, and per ``kv_share`` its bytes / ``per_loop``'s (total and
core; ``last`` at H loops: core 1/H) with its accuracy change. The last line is JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from pipeline_lib.bench.answer_check import (
    against,
    answer_accuracy,
    answer_examples,
    pick_threshold,
    snapshot_task,
)
from pipeline_lib.data.tokenizer import eos_id
from pipeline_lib.diagnostics.timing import alternated
from pipeline_lib.errors import ConfigError, PipelineError
from pipeline_lib.evaluate.exit.cached import CriterionExit
from pipeline_lib.evaluate.generation import CacheOptions, Depth, encode_prompts, parse_depth
from pipeline_lib.model.generate import CachedNextIds, greedy_decode, greedy_generate
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.provenance import cpu_model, git_output
from pipeline_lib.spec.config_load import load_config

BYTE_VOCAB = 258
ROOT = Path(__file__).resolve().parents[1]


def _machine() -> str:
    return f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"


def settings(model: LoopedLM, args: argparse.Namespace) -> dict[str, dict]:
    """Name → options of :class:`CachedNextIds` of every extra setting (module doc)."""
    out = {f"kv_share={share}": {"kv_share": share} for share in args.kv_share}
    if args.adaptive is not None:
        spec = parse_depth(None, args.adaptive, args.h_eff, args.adaptive_criterion).exit
        for share in ["per_loop", *args.kv_share]:
            name = "adaptive" + ("" if share == "per_loop" else f"+kv_share={share}")
            out[name] = {"kv_share": share, "kv_fill": args.kv_fill,
                         "exit_rule": CriterionExit(model, spec)}
    return out


def decode(model: LoopedLM, prompts: list, args: argparse.Namespace, context: int,
           options: dict) -> tuple[list, float, int, int, float]:
    """(tokens, loops computed per token, kv bytes, core kv bytes, loops per decoding pass)
    of cached decoding; a pass runs until its deepest row exits, so its loops are the most
    any row of the batch computed."""
    nxt = CachedNextIds(model, args.h_eff, reserve=args.new_tokens, **options)
    loops: list[int] = []
    passes: list[int] = []

    def next_ids(active: list[int], rows: list[list[int]]) -> list[int]:
        steps = nxt.steps
        out = nxt(active, rows)
        loops.extend(nxt.loops)
        if nxt.steps > steps:  # a decoding pass (the prompt's prefill runs MAX loops anyway)
            passes.append(max(nxt.loops))
        return out

    done = greedy_decode(next_ids, prompts, [args.new_tokens] * len(prompts), eos_id=None,
                         context_len=context)
    return (done, sum(loops) / max(len(loops), 1), nxt.kv_bytes, nxt.kv_bytes_core,
            sum(passes) / max(len(passes), 1))


def block_bound(cfg: Any, h_eff: int, pass_loops: float) -> float:
    """Attention blocks a fixed-depth pass runs over those of a pass of ``pass_loops`` loops:
    the most batch-synchronous early exit can gain when a step's cost is its block calls
    (a small model at any batch, where a call costs the same for 1 row or 16)."""
    fixed = cfg.prelude_layers + h_eff * cfg.core_layers + cfg.coda_layers
    return fixed / (cfg.prelude_layers + pass_loops * cfg.core_layers + cfg.coda_layers)


def measure(model: LoopedLM, prompts: list[list[int]], args: argparse.Namespace,
            context: int) -> dict[str, Any]:
    """Median seconds of each path for ``prompts``, alternated; tokens checked equal."""
    batch = len(prompts)

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
        _, _, full_bytes, full_core, _ = decode(model, prompts, args, context, {})
        row.update(cached_kv_bytes=full_bytes, cached_kv_bytes_core=full_core, settings={})
        for name in extra:
            _, loops, kv_bytes, kv_core, pass_loops = timings.last[name]
            row["settings"][name] = {
                "s": round(median[name], 4), "vs_cached": round(cached / median[name], 2),
                "tokens_per_s": round(batch * args.new_tokens / median[name], 1),
                "mean_loops": round(loops, 3), "loops_over_max": round(loops / args.h_eff, 3),
                "pass_loops": round(pass_loops, 3),
                "block_bound": round(block_bound(model.cfg, args.h_eff, pass_loops), 3),
                "kv_bytes": kv_bytes, "kv_bytes_core": kv_core,
                "kv_bytes_vs_cached": round(kv_bytes / full_bytes, 4),
                "kv_bytes_core_vs_cached": round(kv_core / full_core, 4)}
    return row


def print_row(row: dict[str, Any], args: argparse.Namespace, prompt: str) -> None:
    print(f"d_model {row['d_model']}, batch {row['batch']}: {args.new_tokens} new tokens after "
          f"{prompt}, H_eff {args.h_eff}: cached {row['cached_s']} s, "
          f"uncached {row['uncached_s']} s → speedup {row['speedup']}×", flush=True)
    for name, cell in row.get("settings", {}).items():
        print(f"  {name}: {cell['s']} s, {cell['vs_cached']}× cached tokens/s, "
              f"{cell['mean_loops']} loops/token ({cell['loops_over_max']} of MAX), "
              f"{cell['pass_loops']} loops/pass (bound {cell['block_bound']}×), KV "
              f"{cell['kv_bytes_vs_cached']}× cached ({cell['kv_bytes_core_vs_cached']}× in "
              "the core blocks)", flush=True)


def run_default(args: argparse.Namespace) -> dict[str, Any]:
    """The default architecture, untrained, on random prompts (see the module doc)."""
    cfg = load_config().model
    cfg.vocab_size = BYTE_VOCAB
    args.h_eff = args.h_eff or cfg.loops
    default_width, rows = cfg.d_model, []
    context = args.prompt_tokens + args.new_tokens  # no sliding window: the cache's own case
    for width in args.d_model:
        cfg.d_model = width or default_width
        torch.manual_seed(0)
        model = LoopedLM(copy.deepcopy(cfg)).eval()
        for batch in args.batch:
            gen = torch.Generator().manual_seed(batch)
            prompts = torch.randint(1, BYTE_VOCAB, (batch, args.prompt_tokens),
                                    generator=gen).tolist()
            rows.append(measure(model, prompts, args, context))
            print_row(rows[-1], args, f"{args.prompt_tokens}")
    cfg.d_model = default_width
    return {"rows": rows, "prompt_tokens": args.prompt_tokens,
            "model": {k: getattr(cfg, k) for k in ("d_model", "n_heads", "prelude_layers",
                                                   "core_layers", "coda_layers", "loops")}}


def answer_settings(loaded: Any, examples: list[dict], args: argparse.Namespace
                    ) -> dict[str, Any]:
    """Every setting's answers against fixed depth at MAX (``per_loop``); picks the
    threshold of ``--thresholds`` and sets ``args.adaptive`` to it (unless given)."""
    kw = {"context_len": loaded.seq_len, "max_gen_toks": loaded.config.bench.max_gen_toks,
          "batch_size": max(args.batch)}

    def answers(depth: Depth, share: str = "per_loop", fill: str = "latest") -> Any:
        return answer_accuracy(loaded.model, loaded.tokenizer, examples, depth=depth,
                               cache=CacheOptions(share, fill), **kw)

    def adaptive(threshold: str) -> Depth:
        return parse_depth(None, f"{threshold}:{args.h_eff}", args.h_eff, args.adaptive_criterion)

    reference = answers(Depth(args.h_eff))
    out: dict[str, Any] = {"reference": {"setting": f"h_eff={args.h_eff}, per_loop",
                                         "accuracy": reference.accuracy,
                                         "ci": list(reference.interval()), "n": len(examples),
                                         "loops": reference.loops,
                                         "kv_bytes": reference.kv_bytes,
                                         "kv_bytes_core": reference.kv_bytes_core}}
    for share in args.kv_share:
        run = answers(Depth(args.h_eff), share)
        out[f"kv_share={share}"] = {**against(reference, run), "loops": run.loops,
                                    "kv_bytes_ratio": run.kv_bytes / reference.kv_bytes,
                                    "kv_bytes_core_ratio": run.kv_bytes_core
                                    / reference.kv_bytes_core}
    runs = {t: answers(adaptive(t), fill=args.kv_fill) for t in args.thresholds}
    for t, run in runs.items():
        out[f"threshold={t}"] = {**against(reference, run), "loops": run.loops,
                                 "loops_over_max": run.loops / args.h_eff}
    if runs:
        out["picked"] = pick_threshold(runs, reference)
        if args.adaptive is None and out["picked"] is not None:
            args.adaptive = f"{out['picked']}:{args.h_eff}"
    return out


def run_snapshot(args: argparse.Namespace) -> dict[str, Any]:
    """A trained snapshot on its own bench problems (see the module doc)."""
    from pipeline_lib.evaluate.loading import load_for_eval  # torch + safetensors: this mode

    loaded = load_for_eval(Path(args.snapshot), tokenizer_option="--tokenizer {}")
    args.h_eff = args.h_eff or loaded.config.model.loops
    args.task = args.task or snapshot_task(loaded.config.bench)
    examples = answer_examples(loaded.config.bench, args.task, args.examples)
    ids = encode_prompts(loaded.tokenizer, [e["prompt"] for e in examples], loaded.seq_len,
                         eos_id(loaded.tokenizer))
    longest = max(len(p) for p in ids)
    if longest + args.new_tokens > loaded.seq_len:
        raise ConfigError(f"--new-tokens {args.new_tokens} after prompts of up to {longest} "
                          f"tokens exceeds the snapshot's context ({loaded.seq_len}); pass "
                          f"--new-tokens {loaded.seq_len - longest} or fewer")
    accuracy = answer_settings(loaded, examples, args)
    for name, cell in accuracy.items():
        print(f"answers {name}: {json.dumps(cell)}", flush=True)
    rows = []
    for batch in args.batch:
        prompts = [ids[i % len(ids)] for i in range(batch)]
        rows.append(measure(loaded.model, prompts, args, loaded.seq_len))
        print_row(rows[-1], args, f"{args.task} prompts")
    return {"rows": rows, "snapshot": str(Path(args.snapshot).resolve()), "task": args.task,
            "examples": len(examples), "answers": accuracy,
            "targets": targets(rows, accuracy, args)}


def targets(rows: list[dict[str, Any]], accuracy: dict[str, Any], args: argparse.Namespace
            ) -> dict[str, Any]:
    """Issue 31's target ratios, side by side, from one run's rows and answers."""
    out: dict[str, Any] = {"adaptive": args.adaptive, "max_loops": args.h_eff,
                           "picked_threshold": accuracy.get("picked")}
    for row in rows:
        cell = row.get("settings", {}).get("adaptive")
        if cell is not None:
            out[f"batch {row['batch']}"] = {
                "tokens_per_s_vs_fixed_cached": cell["vs_cached"],  # target ≥ 1.3 at 16
                "loops_computed_over_max": cell["loops_over_max"],  # target ≤ 0.6
                "pass_loops_over_max": round(cell["pass_loops"] / args.h_eff, 3),
                "block_bound": cell["block_bound"]}
    for share in args.kv_share:
        a = accuracy[f"kv_share={share}"]
        out[f"kv_share={share}"] = {
            "kv_bytes_ratio": round(a["kv_bytes_ratio"], 4),
            "kv_bytes_core_ratio": round(a["kv_bytes_core_ratio"], 4),  # last: ≤ 1/H
            "accuracy_change": [a["diff"], a["diff_lo"], a["diff_hi"]], "n": a["n"]}
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="random prompts' length")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16],
                        help="prompts decoded together (16: bench.batch_size's default)")
    parser.add_argument("--d-model", type=int, nargs="+", default=[0],
                        help="widths to measure; 0 = the default model's (not with --snapshot)")
    parser.add_argument("--h-eff", type=int, default=0, help="0 = the model's training loops")
    parser.add_argument("--adaptive", default=None, metavar="[CRITERION:]T[:MAX]",
                        help="also time cached adaptive decoding at this exit")
    parser.add_argument("--adaptive-criterion", default="kl",
                        help="criterion of --thresholds and of an --adaptive naming none")
    parser.add_argument("--kv-share", nargs="+", default=[], metavar="SHARE",
                        help="also time these kv_share settings (last, every:K)")
    parser.add_argument("--kv-fill", default="latest", choices=["latest", "skip"],
                        help="kv_fill of --adaptive (default latest)")
    parser.add_argument("--snapshot", default=None, help="a trained snapshot directory")
    parser.add_argument("--task", default=None,
                        help="--snapshot: the built-in task whose prompts are answered (default: "
                             "the first built-in task of the snapshot's bench.tasks)")
    parser.add_argument("--examples", type=int, default=20, help="--snapshot: per level")
    parser.add_argument("--thresholds", nargs="+", default=[], metavar="T",
                        help="--snapshot: pick the adaptive threshold to time among these")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.thresholds and args.snapshot is None:
        parser.error("--thresholds needs --snapshot (answers are scored on its problems)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        for share in args.kv_share:  # before anything loads or runs
            CacheOptions(kv_share=share, kv_fill=args.kv_fill)
        result = run_snapshot(args) if args.snapshot else run_default(args)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = {"speedup": min(r["speedup"] for r in result["rows"]), **result,
              "new_tokens": args.new_tokens, "h_eff": args.h_eff, "repeats": args.repeats,
              "commit": git_output(ROOT, "rev-parse", "--short", "HEAD") or "unknown",
              "machine": _machine(), "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
