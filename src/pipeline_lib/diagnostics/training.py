"""Training checks on tiny runs through the real segment job: steps in the configured
precision, a 2-segment resume against the uninterrupted run, one FSDP2 segment with one rank."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..checkpoint.manifest import verify_snapshot
from ..checkpoint.restore import load_model_state
from ..device import dist_backend
from ..model.flex import decided_kernel
from ..spec.layout import RunLayout
from ..train.job import train_segment
from .core import STEPS, CheckResult, Context, first_line, max_diff


def metrics(run: Path) -> list[dict[str, Any]]:
    """The rows of ``run``'s train/metrics.jsonl."""

    return [json.loads(line) for line in RunLayout.at(run).metrics.read_text().splitlines()]


def whole_run(ctx: Context) -> Path:
    """The tiny run of :data:`STEPS` steps in one segment (trained once, in ``work/whole``)."""

    out = RunLayout.at(ctx.work / "whole").snapshot(STEPS)
    if not out.exists():
        train_segment(ctx.cfg, ctx.pack(), None, STEPS, out)
    return out


def train_steps(ctx: Context) -> CheckResult:
    """4 steps of a tiny looped MoE model: finite, falling losses; tokens/s of the step loop."""

    out = whole_run(ctx)
    rows = metrics(out.parents[1])
    segment = json.loads((out / "trainer_state.json").read_text())["segments"][-1]
    losses = [float(m["loss"]) for m in rows]
    tokens = STEPS * ctx.cfg.train.global_batch_rows * ctx.cfg.data.seq_len
    figures = {"precision": ctx.precision, "attention": decided_kernel() or "sdpa",
               "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
               "tokens_per_s": round(tokens / max(segment["loop_time_s"], 1e-9))}
    ok = len(losses) == STEPS and all(math.isfinite(v) for v in losses)
    return CheckResult("train_steps", "pass" if ok else "fail", figures,
                       "" if ok else f"losses {losses}")


def _compare_runs(reference: Path, other: Path) -> dict[str, Any]:
    """Losses and final weights of two runs of the same steps: identical, largest differences."""

    a = [float(m["loss"]) for m in metrics(reference.parents[1])]
    b = [float(m["loss"]) for m in metrics(other.parents[1])]
    wa, wb = load_model_state(reference), load_model_state(other)
    same_keys = wa.keys() == wb.keys() and len(a) == len(b)
    weight_diff = max_diff([(wa[k], wb[k]) for k in wa]) if same_keys else math.inf
    pairs = list(zip(a, b, strict=True)) if same_keys else []
    return {"identical": same_keys and a == b and weight_diff == 0.0,
            "max_loss_diff": max((abs(x - y) for x, y in pairs), default=0.0)
            if same_keys else math.inf,
            "max_relative_loss_diff": max((abs(x - y) / max(abs(y), 1e-12) for x, y in pairs),
                                          default=0.0) if same_keys else math.inf,
            "max_weight_diff": weight_diff, "tensors": len(wa)}


def _judged(name: str, ctx: Context, figures: dict[str, Any], what: str,
            exact: bool) -> CheckResult:
    """Bit-identical required where ``exact``; elsewhere losses (relative) and weights
    (absolute) within the precision's tolerance."""
    if exact:
        ok = figures["identical"]
    else:
        tol = ctx.tolerance()
        ok = figures["max_relative_loss_diff"] <= tol and figures["max_weight_diff"] <= tol
    return CheckResult(name, "pass" if ok else "fail", figures, "" if ok else what)


def snapshot_resume(ctx: Context) -> CheckResult:
    """The same 4 steps as 2 + 2 segments (snapshot written, verified, resumed) against one
    segment, with ``train.deterministic``: bit-identical on the CPU; elsewhere the largest
    differences and whether identical."""

    whole = whole_run(ctx)
    layout = RunLayout.at(ctx.work / "split")
    half = train_segment(ctx.cfg, ctx.pack(), None, STEPS // 2, layout.snapshot(STEPS // 2))
    verify_snapshot(half)
    split = train_segment(ctx.cfg, ctx.pack(), half, STEPS, layout.snapshot(STEPS))
    figures = {"segments": 2, "deterministic": ctx.cfg.train.deterministic,
               **_compare_runs(whole, split)}
    figures["losses_identical"] = figures["max_loss_diff"] == 0.0
    return _judged("snapshot_resume", ctx, figures,
                   "2 + 2 steps differ from 4 steps in one segment", ctx.device.type == "cpu")


def fsdp_segment(ctx: Context) -> CheckResult:
    """One segment sharded with FSDP2 by a one-rank process group (gloo on the CPU, nccl on
    CUDA): a sharded snapshot (``model_dcp/``) that verifies, against the unsharded run."""
    if not dist.is_available():
        return CheckResult("fsdp_segment", "skip", detail="torch.distributed is not available")
    if dist.is_initialized():
        return CheckResult("fsdp_segment", "skip",
                           detail="a process group is up already (run the check alone)")
    whole = whole_run(ctx)
    backend = dist_backend(ctx.device)
    out = RunLayout.at(ctx.work / "fsdp").snapshot(STEPS)
    try:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    except (RuntimeError, ValueError) as exc:
        return CheckResult("fsdp_segment", "skip", detail=f"no one-rank {backend} process group "
                                                          f"here ({first_line(exc)})")
    try:
        train_segment(ctx.cfg, ctx.pack(), None, STEPS, out)
    finally:
        dist.destroy_process_group()
    verify_snapshot(out)
    figures = {"backend": backend, "world_size": 1, "sharded": (out / "model_dcp").is_dir(),
               **_compare_runs(whole, out)}
    # bit-identical on the CPU in fp32; in bf16 FSDP2's bf16 parameters and the unsharded
    # run's autocast round differently
    exact = ctx.device.type == "cpu" and ctx.precision == "fp32"
    result = _judged("fsdp_segment", ctx, figures, "the FSDP2 run differs from the unsharded one",
                     exact)
    if not figures["sharded"]:
        result.status, result.detail = "fail", "the snapshot is not sharded (no model_dcp/)"
    return result


def restore_determinism(flags: tuple[bool, bool]) -> None:
    """Put torch's deterministic-algorithms switch back (a training check sets it)."""
    torch._C._set_deterministic_algorithms(flags[0], warn_only=flags[1])


def determinism() -> tuple[bool, bool]:
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled())
