"""Evaluation checks on the device: the H_eff sweep and lm-eval through their real paths on
the throughput run's snapshot, greedy samples through the trainer's path, and the KV cache
against uncached generation (exactness and speed-up)."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import torch

from ..data.tokenizer import eos_id, load_tokenizer
from ..device import resolve_device
from ..evaluate.heff import run_heff
from ..evaluate.loading import load_for_eval
from ..model.generate import CachedNextIds, greedy_decode, greedy_generate
from ..model.looped import LoopedLM
from ..spec.config import BenchConfig
from ..spec.names import BUILTIN_TASK_NAMES
from ..train.evaluation import generate_samples
from .core import CheckResult, Context, max_diff, relative_diff
from .timing import alternated
from .workloads import trained_model

H_EFFS = [1, 2, 4, 8]
PROMPT_TOKENS = 32


def _sweep(ctx: Context, device: str, precision: str, max_tokens: int, name: str
           ) -> tuple[dict[str, Any], float]:
    """``run_heff`` (the eval_heff stage's function) on the trained snapshot; (result, s)."""

    run = trained_model(ctx)
    started = time.perf_counter()
    result = run_heff(run.snapshot, run.pack, H_EFFS, ctx.work / "heff" / f"{name}.json",
                      max_tokens=max_tokens,
                      batch_rows=4 if resolve_device(device).type == "cpu" else 16,
                      device=device, precision=precision)
    return result, time.perf_counter() - started


def heff_sweep(ctx: Context) -> CheckResult:
    """The H_eff sweep of the trained snapshot on the device: tokens/s of the whole
    ``run_heff`` call (snapshot loading included) and, off the CPU, against the CPU's sweep
    of the same snapshot (target ≥ 50×)."""
    on_cpu = ctx.device.type == "cpu"
    exp = ctx.cfg.experiment
    if not on_cpu:  # compiles the inference graphs, so the timed run measures the sweep
        _sweep(ctx, exp.device, exp.precision, 1024, "warmup")
    result, seconds = _sweep(ctx, exp.device, exp.precision, ctx.sizes.heff_tokens, "device")
    figures: dict[str, Any] = {
        "device": result["device"], "precision": result["precision"], "h_eff": H_EFFS,
        "tokens": result["tokens"], "seconds": round(seconds, 3),
        "tokens_per_s": round(result["tokens"] / seconds),
        "losses": {h: round(v, 4) for h, v in result["losses"].items()}}
    check = CheckResult("heff_sweep", "pass", figures)
    if on_cpu:
        check.skipped["vs_cpu"] = "the check runs on the CPU: no accelerator to compare with"
    else:
        cpu, cpu_s = _sweep(ctx, "cpu", "fp32", ctx.sizes.heff_cpu_tokens, "cpu")
        figures.update(cpu_tokens=cpu["tokens"], cpu_seconds=round(cpu_s, 3),
                       cpu_tokens_per_s=round(cpu["tokens"] / cpu_s))
        figures["speedup_vs_cpu"] = round(figures["tokens_per_s"] / figures["cpu_tokens_per_s"], 1)
    if result["device"] != ctx.device.type or not all(
            math.isfinite(v) for v in result["losses"].values()):
        check.status, check.detail = "fail", f"losses {result['losses']} on {result['device']}"
    return check


def lm_eval(ctx: Context) -> CheckResult:
    """The built-in lm-eval tasks (multiple choice and generation) through the bench stage's
    function on the device: examples per second."""
    try:
        import lm_eval as _  # noqa: F401  (a probe: the bench extra may be absent)
    except ImportError:
        return CheckResult("lm_eval", "skip", detail="lm-eval is not installed (the bench extra)")
    from ..bench.runner import run_benchmarks  # imports lm-eval: only once it is there


    per_level, levels, h_effs, gen_tokens = ctx.sizes.bench
    bench = BenchConfig(tasks=list(BUILTIN_TASK_NAMES), h_eff=list(h_effs), examples_per_level=per_level,
                        max_difficulty=levels, max_gen_toks=gen_tokens, batch_size=16)
    run = trained_model(ctx)
    report = run_benchmarks(run.snapshot, bench, ctx.work / "bench_tasks",
                            ctx.work / "bench.json", device=ctx.cfg.experiment.device,
                            precision=ctx.cfg.experiment.precision)
    examples = sum(int(info.get("n", 0)) for info in report["tasks"].values()) * len(h_effs)
    figures = {"tasks": len(report["tasks"]), "h_eff": list(h_effs), "examples": examples,
               "max_gen_toks": gen_tokens, "seconds": report["seconds"],
               "examples_per_s": round(examples / max(report["seconds"], 1e-9), 1)}
    ok = set(report["tasks"]) == set(BUILTIN_TASK_NAMES) and examples > 0
    return CheckResult("lm_eval", "pass" if ok else "fail", figures,
                       "" if ok else f"scored {sorted(report['tasks'])}, {examples} examples")


def generation(ctx: Context) -> CheckResult:
    """Greedy samples through the trainer's sampling path against a reference that
    recomputes the whole prefix per token: identical tokens, tokens/s of each."""

    pack, tokens = ctx.pack(), 32
    tok = load_tokenizer(pack)
    torch.manual_seed(0)
    cfg = dataclasses.replace(ctx.cfg.model, vocab_size=tok.get_vocab_size(), moe_experts=0)
    model = LoopedLM(cfg).to(ctx.device).eval()
    prompt = ctx.cfg.train.sample_prompts[0]
    with ctx.autocast():
        started = time.perf_counter()
        [record] = generate_samples(model, pack, [prompt], tokens, step=0, loops=cfg.loops,
                                    context_len=ctx.cfg.data.seq_len, device=ctx.device)
        path_s = time.perf_counter() - started

        def next_ids(_: list[int], rows: list[list[int]]) -> list[int]:
            with torch.no_grad():
                ids = torch.tensor(rows, device=ctx.device)
                return model.logits_at(ids, cfg.loops)[:, -1].argmax(dim=-1).tolist()

        started = time.perf_counter()
        ids = tok.encode(prompt, add_special_tokens=False).ids
        [(reference, _)] = greedy_decode(next_ids, [ids], [tokens],
                                         eos_id=eos_id(tok),
                                         context_len=ctx.cfg.data.seq_len)
        reference_s = time.perf_counter() - started
    same = record["completion_ids"] == reference
    figures = {"new_tokens": len(reference), "identical": same,
               "tokens_per_s": round(len(reference) / max(path_s, 1e-9), 1),
               "reference_tokens_per_s": round(len(reference) / max(reference_s, 1e-9), 1)}
    return CheckResult("generation", "pass" if same else "fail", figures)


def _prompts(batch: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return torch.randint(1, vocab, (batch, PROMPT_TOKENS), generator=gen).tolist()


def _exactness(model: Any, h_eff: int, prompts: list[list[int]], new: int,
               device: torch.device) -> dict[str, Any]:
    """fp32: the logits of every cached decoding step against one full forward of the same
    tokens (teacher forcing), and whether the uncached window picks the same tokens."""

    seen: list[torch.Tensor] = []

    class Recording(CachedNextIds):
        def logits(self, active: list[int], rows: list[list[int]]) -> torch.Tensor:
            out = super().logits(active, rows)
            seen.append(out.float())
            return out

    context = PROMPT_TOKENS + new
    with torch.no_grad():
        cached = greedy_decode(Recording(model, h_eff, device=device, reserve=new), prompts,
                               [new] * len(prompts), eos_id=None, context_len=context)
        full = torch.tensor([p + ids for p, (ids, _) in zip(prompts, cached, strict=True)],
                            device=device)
        ref = model.logits_at(full, h_eff)[:, PROMPT_TOKENS - 1: -1].float()  # [B, new, V]
    window = greedy_generate(model, prompts, new, h_eff=h_eff, eos_id=None, context_len=context,
                             use_cache=False, device=device)
    steps = torch.stack(seen, dim=1)  # [B, new, V]
    return {"identical_fp32": [ids for ids, _ in cached] == [ids for ids, _ in window],
            "max_logit_diff_fp32": max_diff([(steps, ref)]),
            "relative_logit_diff_fp32": relative_diff(steps, ref)}


def _speed(ctx: Context, model: Any, h_eff: int, batch: int, vocab: int) -> dict[str, Any]:
    """Cached against uncached greedy generation of ``batch`` prompts, alternated."""

    prompts, new = _prompts(batch, vocab), ctx.sizes.kv_new_tokens
    outs: dict[bool, Any] = {}

    def run(use_cache: bool):
        def call() -> None:
            with ctx.autocast():
                outs[use_cache] = greedy_generate(
                    model, prompts, new, h_eff=h_eff, eos_id=None,
                    context_len=PROMPT_TOKENS + new, use_cache=use_cache, device=ctx.device)
        return call

    times = alternated({"cached": run(True), "uncached": run(False)}, ctx.sizes.repeats,
                       ctx.device).median_ms()
    return {"batch": batch, "cached_ms": times["cached"], "uncached_ms": times["uncached"],
            "speedup": round(times["uncached"] / max(times["cached"], 1e-9), 2),
            f"same_tokens_{ctx.precision}": outs[True] == outs[False]}


def kv_cache(ctx: Context) -> CheckResult:
    """KV-cached greedy generation against recomputing the window, on the trained model:
    exact in fp32 (the same tokens; logits against a full forward), speed-up per batch size
    for ``sizes.kv_new_tokens`` new tokens after 32 in the configured precision."""

    run = trained_model(ctx)
    loaded = load_for_eval(run.snapshot, with_tokenizer=False, device=ctx.device)
    model, h_eff = loaded.model, loaded.config.model.loops
    vocab = loaded.config.model.vocab_size
    new = ctx.sizes.kv_new_tokens
    figures: dict[str, Any] = {"h_eff": h_eff, "prompt_tokens": PROMPT_TOKENS, "new_tokens": new,
                               **_exactness(model, h_eff, _prompts(2, vocab), new, ctx.device)}
    figures["batches"] = [_speed(ctx, model, h_eff, b, vocab) for b in ctx.sizes.kv_batches]
    figures["speedup"] = min(row["speedup"] for row in figures["batches"])
    exact = figures["relative_logit_diff_fp32"] <= 1e-4
    ok = exact and (figures["identical_fp32"] or ctx.device.type != "cpu")
    return CheckResult("kv_cache", "pass" if ok else "fail", figures,
                       "" if ok else "cached generation differs from the uncached window")
