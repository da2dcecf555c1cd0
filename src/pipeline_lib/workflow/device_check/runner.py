"""Run the checks in order within a time budget, and report them as a table and one JSON."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ...device import resolve_device
from ...provenance import git_output
from ...spec.config import Config
from .core import CheckResult, Context, Sizes, check_config, first_line
from .evaluation import generation, heff_sweep, kv_cache, lm_eval
from .kernels import flex_attention, moe_grouped_mm
from .loss import cross_entropy
from .throughput import train_throughput
from .training import determinism, fsdp_segment, restore_determinism, snapshot_resume, train_steps

log = logging.getLogger(__name__)

RUNS: dict[str, Callable[[Context], CheckResult]] = {
    "train_steps": train_steps, "snapshot_resume": snapshot_resume,
    "fsdp_segment": fsdp_segment, "cross_entropy": cross_entropy,
    "flex_attention": flex_attention, "moe_grouped_mm": moe_grouped_mm,
    "train_throughput": train_throughput, "heff_sweep": heff_sweep, "lm_eval": lm_eval,
    "generation": generation, "kv_cache": kv_cache}
CHECKS = tuple(RUNS)
BUDGET_S = 480.0  # the whole check fits in 8 minutes on an H100/H200-class GPU


def _run_one(name: str, ctx: Context) -> CheckResult:
    started, flags = time.perf_counter(), determinism()
    try:
        result = RUNS[name](ctx)
    except Exception as exc:  # a failing check is reported; the others still run
        log.debug("check %s failed", name, exc_info=True)
        result = CheckResult(name, "fail", detail=first_line(exc))
    finally:
        restore_determinism(flags)  # a training check switched deterministic kernels on
    result.figures["seconds"] = round(time.perf_counter() - started, 2)
    return result


def run_device_check(cfg: Config, work_dir: Path, only: Sequence[str] = CHECKS, *,
                     quick: bool = False, budget_s: float = BUDGET_S,
                     peak_tflops: float | None = None,
                     on_result: Callable[[list[CheckResult]], None] | None = None,
                     ) -> list[CheckResult]:
    """Run the ``only`` checks (in :data:`CHECKS` order) in ``work_dir``; one result each.

    ``quick``: CPU-sized workloads that skip FlexAttention's compile and the Triton
    interpreter (tests). A check that would start after ``budget_s`` seconds is skipped.
    ``on_result(results so far)`` runs after every check, so a run cut short by a time limit
    still leaves what it measured.
    """
    device = resolve_device(cfg.experiment.device)
    ctx = Context(check_config(cfg), device, Path(work_dir), quick=quick,
                  sizes=Sizes.for_device(device, quick), peak_tflops=peak_tflops)
    started, results = time.perf_counter(), []
    for name in (n for n in CHECKS if n in only):
        spent = time.perf_counter() - started
        if spent > budget_s:
            results.append(CheckResult(name, "skip", detail=f"time budget spent ({spent:.0f} s "
                                                            f"of {budget_s:.0f} s)"))
        else:
            log.info("device check: %s", name)
            results.append(_run_one(name, ctx))
        if on_result is not None:
            on_result(results)
    return results


def _commit() -> str:
    """The checkout's commit: ``LOOPLINE_COMMIT`` (a copy of the tree without .git, as on a
    lent device machine), else ``git rev-parse``, else "unknown"."""
    return (os.environ.get("LOOPLINE_COMMIT")
            or git_output(Path(__file__).parent, "rev-parse", "--short", "HEAD") or "unknown")


def describe_device(name: str) -> dict[str, str]:
    """``experiment.device``, what it resolved to, its model name (CUDA), torch's version,
    the commit checked and the date (UTC)."""
    device = resolve_device(name)
    info = {"device": name, "resolved": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    info["commit"] = _commit()
    info["date"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return info


def _brief(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_brief(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return "[" + "; ".join(_brief(v) for v in value) + "]"
    return str(value)


def format_row(r: CheckResult) -> str:
    """One check as a row of the text table: name, status, figures, detail, skipped parts."""
    figures = ", ".join(f"{k}={_brief(v)}" for k, v in r.figures.items())
    notes = [r.detail] if r.detail else []
    notes += [f"skipped {part}: {why}" for part, why in r.skipped.items()]
    return f"{r.name:<17} {r.status:<6} {figures}" + (f"  ({'; '.join(notes)})" if notes else "")


def format_report(results: Sequence[CheckResult], device: dict[str, str]) -> str:
    """The results as a text table (check, status, figures, detail, skipped parts)."""
    where = ", ".join(f"{k} {v}" for k, v in device.items())
    lines = [f"device check: {where}", f"{'check':<17} {'status':<6} figures"]
    return "\n".join([*lines, *map(format_row, results)])


def report_json(results: Sequence[CheckResult], device: dict[str, str],
                quick: bool, complete: bool = True) -> dict[str, Any]:
    """The JSON document: the device, every check's status and figures, and ``skipped``
    (``check`` or ``check.part`` → the reason it did not run); ``complete`` is false in the
    partial documents written while the checks run."""
    checks, skipped = {}, {}
    for r in results:
        checks[r.name] = {"status": r.status, **r.figures,
                          **({"detail": r.detail} if r.detail else {}),
                          **({"skipped": r.skipped} if r.skipped else {})}
        if r.status == "skip":
            skipped[r.name] = r.detail
        skipped.update({f"{r.name}.{part}": why for part, why in r.skipped.items()})
    seconds = round(sum(float(r.figures.get("seconds", 0.0)) for r in results), 1)
    return {**device, "quick": quick, "complete": complete, "seconds": seconds,
            "checks": checks, "skipped": skipped}
