"""The cross-entropy check: the Triton chunk kernel, torch's chunked loss and eager
``F.cross_entropy`` on the same inputs: loss and gradients equal, time, peak memory.

On CUDA all three run here (peak memory from the allocator's counter). On the CPU Triton
runs only under its interpreter (``TRITON_INTERPRET=1``, which must be set before triton is
imported), so that comparison runs in a child process at a tiny shape; peak memory there
would need a fresh process per method (``benchmarks/bench_loss.py`` measures it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import pipeline_lib

from ..device import synchronize
from ..model.loss import chunked_cross_entropy
from ..model.triton_loss import triton_available
from ..spec.names import IGNORE_INDEX
from .core import CheckResult, Context, first_line, relative_diff
from .timing import alternated

METHODS = ("eager", "torch", "triton")
INTERPRETED = (64, 16, 1024)  # tokens, width, vocabulary under TRITON_INTERPRET (slow)


def _inputs(n: int, d: int, v: int, device: torch.device, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(v)
    hidden = torch.randn(n, d, generator=gen).to(device, dtype).requires_grad_(True)
    weight = (torch.randn(v, d, generator=gen) * d**-0.5).to(device, dtype).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=gen)
    targets[::17] = IGNORE_INDEX
    return hidden, weight, targets.to(device)


def _step(method: str, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
          chunk_size: int) -> list[torch.Tensor]:
    """Loss and its gradients (hidden, weight) by ``method``."""

    hidden.grad = weight.grad = None
    if method == "eager":
        loss = F.cross_entropy((hidden @ weight.T).float(), targets)
    else:
        loss = chunked_cross_entropy(hidden, weight, targets, chunk_size=chunk_size,
                                     backend=method)
    loss.backward()
    return [loss.detach(), hidden.grad, weight.grad]


def _peak_mb(fn: Callable[[], Any], device: torch.device, tensors: tuple) -> float:
    """MB the call allocated at its peak beyond its inputs (CUDA), gradients included."""
    tensors[0].grad = tensors[1].grad = None
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)


def compare(n: int, d: int, v: int, methods: tuple[str, ...], device: torch.device,
            dtype: torch.dtype, chunk_size: int, repeats: int) -> dict[str, Any]:
    """``methods`` on one shape: differences against eager (relative to its largest value) and,
    with ``repeats``, ms each and on CUDA peak MB each."""
    tensors = _inputs(n, d, v, device, dtype)
    runs = {m: (lambda m=m: _step(m, *tensors, chunk_size)) for m in methods}
    results = {m: [t.clone() for t in run()] for m, run in runs.items()}
    out: dict[str, Any] = {"n": n, "d": d, "v": v, "dtype": str(dtype).removeprefix("torch.")}
    for m in methods[1:]:
        out[f"{m}_loss_diff"] = relative_diff(results[m][0], results["eager"][0])
        out[f"{m}_grad_diff"] = max(relative_diff(a, b) for a, b in zip(
            results[m][1:], results["eager"][1:], strict=True))
    del results
    if repeats:
        out.update({f"{m}_ms": t for m, t in alternated(runs, repeats, device).median_ms().items()})
    if repeats and device.type == "cuda":
        for m, run in runs.items():
            out[f"{m}_peak_mb"] = _peak_mb(run, device, tensors)
    return out


def interpreted_main() -> None:
    """Child process under ``TRITON_INTERPRET=1``: :func:`compare` of argv[1] (JSON) → stdout;
    untimed (the interpreter's speed says nothing about the kernel's)."""
    args = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    print(json.dumps(compare(*args["shape"], METHODS, torch.device("cpu"), torch.float32,
                             args["chunk_size"], 0)))


def _interpreted(chunk_size: int) -> dict[str, Any]:
    """The three methods on the CPU at :data:`INTERPRETED`, Triton interpreted (child process)."""
    src = str(Path(pipeline_lib.__file__).resolve().parents[1])
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    code = "from pipeline_lib.diagnostics.loss import interpreted_main; interpreted_main()"
    arg = json.dumps({"shape": list(INTERPRETED), "chunk_size": chunk_size})
    done = subprocess.run([sys.executable, "-c", code, arg], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Triton interpreter run failed: {done.stderr.strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _triton_missing(ctx: Context) -> str:
    """Why the Triton kernel cannot run here ('' when it can)."""

    if not triton_available():
        return "triton is not installed (the triton extra)"
    if ctx.device.type not in ("cuda", "cpu"):
        return f"the Triton kernel runs on CUDA only, not on {ctx.device.type}"
    if ctx.device.type == "cpu" and ctx.quick:
        return "--quick: the Triton interpreter runs in the full CPU check"
    return ""


def _ok(shape: dict[str, Any], tolerance: float) -> bool:
    return all(value <= tolerance for key, value in shape.items() if key.endswith("_diff"))


def cross_entropy(ctx: Context) -> CheckResult:
    """Triton vs torch chunked vs eager cross-entropy: equal values and gradients; time and
    (CUDA) peak memory, with the ratios the targets name (Triton ≥ 1.5× faster than eager at
    ≤ 0.1 of its peak memory)."""
    chunk, sizes, dtype = ctx.cfg.model.loss_chunk_size, ctx.sizes, ctx.dtype()
    missing = _triton_missing(ctx)
    on_device = ctx.device.type == "cuda" and not missing
    methods = METHODS if on_device else METHODS[:2]
    shapes = []
    for v in sizes.ce_vocabs:
        try:
            shapes.append(compare(sizes.ce_tokens, sizes.ce_dim, v, methods, ctx.device, dtype,
                                  chunk, sizes.repeats))
        except torch.OutOfMemoryError as exc:
            shapes.append({"v": v, "skipped": f"out of memory ({first_line(exc)})"})
    result = CheckResult("cross_entropy", "pass", {"chunk_size": chunk, "shapes": shapes})
    if missing:
        result.skipped["triton"] = missing
    elif not on_device:  # the CPU, Triton interpreted in a child process
        try:
            shapes.append({"interpreted": True, **_interpreted(chunk)})
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            result.status, result.detail = "fail", first_line(exc)
    if ctx.device.type != "cuda":
        result.skipped["peak_memory"] = ("measured on CUDA only (here: benchmarks/bench_loss.py, "
                                         "one process per method)")
    for shape in shapes:
        if "triton_ms" in shape:
            shape["triton_speedup_vs_eager"] = round(shape["eager_ms"] / shape["triton_ms"], 2)
        if "triton_peak_mb" in shape:
            shape["triton_peak_ratio"] = round(shape["triton_peak_mb"] /
                                               max(shape["eager_peak_mb"], 1e-9), 4)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    if not all(_ok(s, tol) for s in shapes):
        result.status, result.detail = "fail", f"a loss or gradient differs by more than {tol:g}"
    return result
