"""Kernel checks: compiled FlexAttention against SDPA with the document mask (a tiny model at
four lengths, then the kernel alone at a training shape), MoE grouped GEMM against the loop."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch._dynamo.utils import counters

from ..model import flex as flex_mod
from ..model import moe
from ..model.attention import DocumentMask, document_attention
from ..model.looped import LoopedLM
from ..spec.config_model import ModelConfig
from .core import CheckResult, Context, max_diff
from .timing import alternated, median_ms

LENGTHS = (100, 300, 517, 1000)  # rows FlexAttention sees padded to 256, 384, 640, 1024


def _twins(ctx: Context) -> tuple[Any, Any]:
    torch.manual_seed(0)
    base = ModelConfig(vocab_size=256, d_model=64, n_heads=4, loops=2, coda_layers=0)
    flex = LoopedLM(dataclasses.replace(base, attention="flex")).to(ctx.device)
    sdpa = LoopedLM(dataclasses.replace(base, attention="sdpa")).to(ctx.device)
    sdpa.load_state_dict(flex.state_dict())
    return flex, sdpa


def _rows(length: int, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (2, length), generator=gen)
    doc = torch.zeros(2, length, dtype=torch.long)
    doc[0, length // 3:] = 1
    return {"input_ids": ids.to(device), "doc_ids": doc.to(device)}


def packed_doc_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """[batch, length] document ids of packed rows: documents of 32–1024 tokens back to back."""
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(32, 1025, (batch, length // 32 + 1), generator=gen)
    ends = sizes.cumsum(dim=1)  # [batch, docs]
    positions = torch.arange(length).expand(batch, length).contiguous()
    return torch.searchsorted(ends, positions, right=True)


def _kernel_timing(ctx: Context, backward: bool) -> dict[str, Any]:
    """Flex vs SDPA (dense document mask) alone at ``sizes.attn``: difference and ms each."""

    B, H, L, hd = ctx.sizes.attn
    doc = packed_doc_ids(B, L).to(ctx.device)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, L, hd, generator=gen).to(ctx.device, ctx.dtype())
               .requires_grad_(backward) for _ in range(3))
    masks = {kernel: DocumentMask.build(doc, kernel) for kernel in ("flex", "sdpa")}

    def run(kernel: str):
        def call() -> torch.Tensor:
            out = document_attention(q, k, v, masks[kernel])
            if backward:
                out.float().square().mean().backward()
            return out
        return call

    with torch.set_grad_enabled(backward):
        diff = max_diff([(run("flex")(), run("sdpa")())])
        times = alternated({"flex": run("flex"), "sdpa": run("sdpa")}, ctx.sizes.repeats,
                           ctx.device).median_ms()
    return {"shape": [B, H, L, hd], "pass": "fwd+bwd" if backward else "fwd",
            "max_diff": diff, "flex_ms": times["flex"], "sdpa_dense_ms": times["sdpa"],
            "flex_speedup": round(times["sdpa"] / max(times["flex"], 1e-9), 2)}


def _grad_diff(ctx: Context, flex: Any, sdpa: Any) -> float:
    batch = {**_rows(LENGTHS[1], ctx.device), "targets": _rows(LENGTHS[1], ctx.device, 1)[
        "input_ids"]}
    grads = []
    for model in (flex, sdpa):
        model.zero_grad()
        with ctx.autocast():
            model.losses(batch, [2])[2].backward()
        grads.append([p.grad for p in model.parameters()])
    return max_diff(list(zip(*grads, strict=True)))


def _lengths(ctx: Context, flex: Any, sdpa: Any) -> dict[str, Any]:
    """The twins at every length: largest difference, graphs compiled after the first."""
    counters.clear()
    graphs, pairs = [], []
    with torch.no_grad(), ctx.autocast():
        for length in LENGTHS:
            batch = _rows(length, ctx.device)
            pairs.append((flex.logits_at(batch, 2), sdpa.logits_at(batch, 2)))
            graphs.append(counters["stats"]["unique_graphs"])
        batch = _rows(LENGTHS[-1], ctx.device)
        return {"max_diff": max_diff(pairs), "graphs": graphs[-1],
                "recompiles_after_first_length": graphs[-1] - graphs[0],
                "flex_ms": median_ms(lambda: flex.logits_at(batch, 2), ctx.device),
                "sdpa_ms": median_ms(lambda: sdpa.logits_at(batch, 2), ctx.device)}


def flex_attention(ctx: Context) -> CheckResult:
    """Compiled FlexAttention against SDPA with the document mask: a tiny model at four
    lengths (difference, no recompiles, ms), gradients off the CPU, then the kernel alone at
    ``sizes.attn`` (difference, ms each; forward and backward off the CPU)."""

    if ctx.quick:
        return CheckResult("flex_attention", "skip",
                           detail="--quick: FlexAttention's first compile takes ~20 s on a CPU")
    flex_mod.reset_flex_decision()
    try:
        flex, sdpa = _twins(ctx)
        figures: dict[str, Any] = {"kernel": "flex", **_lengths(ctx, flex, sdpa)}
        if flex_mod.decided_kernel() != "flex":
            return CheckResult("flex_attention", "fail", {"kernel": "sdpa"},
                               flex_mod.attention_tags().get("loopline.attention_fallback", ""))
        on_cpu = ctx.device.type == "cpu"
        if not on_cpu:
            figures["grad_diff"] = _grad_diff(ctx, flex, sdpa)
        figures["kernel_alone"] = _kernel_timing(ctx, backward=not on_cpu)
        tol = ctx.tolerance()
        ok = (figures["max_diff"] <= tol and figures["recompiles_after_first_length"] == 0
              and figures.get("grad_diff", 0.0) <= tol
              and figures["kernel_alone"]["max_diff"] <= tol)
        result = CheckResult("flex_attention", "pass" if ok else "fail", figures)
        if on_cpu:
            result.skipped["backward"] = "torch has no FlexAttention backward on the CPU"
        return result
    finally:
        flex_mod.reset_flex_decision()


def _moe_layer(width: int, ctx: Context) -> Any:
    layer = moe.MoEFFN(64, width, 8, 2, 0.0, 0.0)
    layer.reset_parameters(0.1, 0.05)
    return layer.to(ctx.device, ctx.dtype())


def moe_grouped_mm(ctx: Context) -> CheckResult:
    """Grouped GEMM against the per-expert loop (forward and backward, difference, ms each) and
    an unaligned expert width (58) that must fall back to the loop."""

    if not hasattr(torch, "_grouped_mm"):
        return CheckResult("moe_grouped_mm", "skip", detail="torch has no _grouped_mm")
    dtype = ctx.dtype()
    moe.reset_grouped_mm_choices()
    try:
        if not moe.grouped_mm_works(ctx.device, dtype):
            return CheckResult("moe_grouped_mm", "fail", {"dtype": str(dtype)},
                               "the grouped GEMM probe failed (see the log)")
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(4, 128, 64, generator=gen).to(ctx.device, dtype)
        layer = _moe_layer(64, ctx)
        outs, times = {}, {}
        for impl in ("grouped", "loop"):
            layer.expert_impl = impl

            def step() -> list[torch.Tensor]:
                layer.zero_grad()
                xi = x.clone().requires_grad_(True)
                y = layer(xi)
                y.float().square().mean().backward()
                return [y, xi.grad, layer.w_gate.grad, layer.w_down.grad]

            outs[impl], times[impl] = step(), median_ms(step, ctx.device)
        with torch.no_grad():
            _moe_layer(58, ctx)(x)  # unaligned rows: the loop, after a warning
        paths = moe.expert_paths()
        figures = {"dtype": str(dtype).removeprefix("torch."),
                   "max_diff": max_diff(list(zip(outs["grouped"], outs["loop"], strict=True))),
                   "grouped_ms": times["grouped"], "loop_ms": times["loop"],
                   "width_58": next((v for k, v in paths.items() if k.startswith("64x58")), "?")}
        ok = figures["max_diff"] <= ctx.tolerance() and figures["width_58"] == "loop"
        return CheckResult("moe_grouped_mm", "pass" if ok else "fail", figures)
    finally:
        moe.reset_grouped_mm_choices()
