"""Training throughput of the ~125M-parameter looped model at 4 loops through the real
segment job: tokens/s and model FLOP utilisation against the device's bf16 peak."""

from __future__ import annotations

import math
import statistics
from typing import Any

import torch

from .core import CheckResult, Context
from .peaks import bf16_peak
from .workloads import trained_model

STEADY_FROM = 0.25  # steps before this fraction of the run warm up (compiles, allocator)


def _peak(ctx: Context) -> tuple[str, float] | str:
    """(label, bf16 TFLOP/s) of this device, or why there is none."""
    if ctx.device.type != "cuda":
        return f"no bf16 peak for a {ctx.device.type} device: FLOP/s reported without MFU"
    name = torch.cuda.get_device_name(ctx.device)
    if ctx.peak_tflops:
        return f"{name} (--peak-tflops)", ctx.peak_tflops
    known = bf16_peak(name)
    if known is None:
        return f"{name} is not in the table of bf16 peaks; pass --peak-tflops"
    return known


def _steady_tokens_per_s(rows: list[dict[str, Any]]) -> float:
    """Median tokens/s of the steps after the warm-up fraction (the last step at least)."""
    speeds = [float(r["tokens_per_s"]) for r in rows]
    return statistics.median(speeds[int(len(speeds) * STEADY_FROM):] or speeds[-1:])


def train_throughput(ctx: Context) -> CheckResult:
    """Tokens/s of the trainer's steps (median after the warm-up) and, with a known bf16
    peak, model FLOP utilisation: 3 × forward FLOPs per token (matmuls of every block
    application and the head, plus full-context attention) × tokens/s ÷ peak."""
    from ...checkpoint.compat import snapshot_config
    from ...spec.size import flops_per_token, param_count

    run = trained_model(ctx)
    model, seq_len = snapshot_config(run.snapshot).model, run.cfg.data.seq_len  # vocab resolved
    losses = [float(r["loss"]) for r in run.rows]
    tokens_per_s = _steady_tokens_per_s(run.rows)
    flops = 3 * flops_per_token(model, seq_len)
    figures: dict[str, Any] = {
        "params": param_count(model), "d_model": model.d_model, "loops": model.loops,
        "blocks": [model.prelude_layers, model.core_layers, model.coda_layers],
        "seq_len": seq_len, "rows": run.cfg.train.global_batch_rows, "steps": len(run.rows),
        "precision": ctx.precision, "compile": run.cfg.train.compile,
        "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
        "tokens_per_s": round(tokens_per_s), "train_flops_per_token": flops,
        "model_tflops_per_s": round(flops * tokens_per_s / 1e12, 3)}
    result = CheckResult("train_throughput", "pass", figures)
    peak = _peak(ctx)
    if isinstance(peak, str):
        result.skipped["mfu"] = peak
    else:
        figures["peak_label"], figures["peak_tflops"] = peak
        figures["mfu"] = round(figures["model_tflops_per_s"] / peak[1], 4)
        if ctx.precision != "bf16":
            result.skipped["mfu_bf16"] = f"trained in {ctx.precision}; the peak is bf16's"
    if not all(math.isfinite(v) for v in losses) or len(losses) != run.cfg.train.total_steps:
        result.status, result.detail = "fail", f"losses {losses}"
    return result

