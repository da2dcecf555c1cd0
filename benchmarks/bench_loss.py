"""Chunked vs eager cross-entropy, forward + backward: peak memory and time, side by side.

    python benchmarks/bench_loss.py [--n 4096 --d 256 --v 32000 --chunk-size 256]

eager   = F.cross_entropy(hidden @ weight.T, targets)  (materialises [N, V] logits)
chunked = pipeline_lib.model.loss.chunked_cross_entropy   (chunks of --chunk-size rows)

Peak memory: each method runs once in its own fresh process; the peak resident set size
(VmHWM, reset through /proc/self/clear_refs just before the measured call, with ru_maxrss as
the fallback) minus the resident size before the call. That counts every byte the loss
allocates, gradients included, and nothing of the interpreter or the inputs. On CUDA the
allocator's peak counter is used instead. Time: median of --repeats alternating runs in
this process (after one warm-up each). The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from pipeline_lib.diagnostics.timing import alternated
from pipeline_lib.model.loss import chunked_cross_entropy

STATUS = Path("/proc/self/status")


def _inputs(n: int, d: int, v: int, device: str):
    gen = torch.Generator().manual_seed(0)
    hidden = (torch.randn(n, d, generator=gen)).to(device).requires_grad_(True)
    weight = (torch.randn(v, d, generator=gen) * d**-0.5).to(device).requires_grad_(True)
    targets = torch.randint(0, v, (n,), generator=gen).to(device)
    targets[::17] = -100
    return hidden, weight, targets


def _step(method: str, hidden, weight, targets, chunk_size: int) -> float:
    hidden.grad = weight.grad = None
    if method == "eager":
        loss = F.cross_entropy(hidden @ weight.T, targets)
    else:
        loss = chunked_cross_entropy(hidden, weight, targets, chunk_size=chunk_size)
    loss.backward()
    return loss.item()


def _rss_kb() -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", STATUS.read_text()).group(1))


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_kb(reset_ok: bool) -> int:
    if reset_ok:
        return int(re.search(r"VmHWM:\s+(\d+)", STATUS.read_text()).group(1))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def worker(args: argparse.Namespace) -> None:
    """Measure one method's peak memory in this (fresh) process; print JSON."""
    torch.set_num_threads(args.threads)
    small = _inputs(64, args.d, 512, args.device)
    _step(args.worker, *small, args.chunk_size)  # load kernels outside the measurement
    hidden, weight, targets = _inputs(args.n, args.d, args.v, args.device)
    if args.device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        loss = _step(args.worker, hidden, weight, targets, args.chunk_size)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base_kb = _rss_kb()
        reset_ok = _reset_peak()
        loss = _step(args.worker, hidden, weight, targets, args.chunk_size)
        peak = (_peak_kb(reset_ok) - base_kb) * 1024
    print(json.dumps({"peak_bytes": peak, "loss": loss}))


def _measure_memory(method: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", method, "--n", str(args.n), "--d", str(args.d),
           "--v", str(args.v), "--chunk-size", str(args.chunk_size), "--threads",
           str(args.threads), "--device", args.device]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4096, help="tokens (rows of hidden)")
    p.add_argument("--d", type=int, default=256, help="hidden width")
    p.add_argument("--v", type=int, default=32000, help="vocabulary size")
    p.add_argument("--chunk-size", type=int, default=256, help="rows per chunk")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--worker", choices=["eager", "chunked"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    torch.set_num_threads(args.threads)
    mem = {m: _measure_memory(m, args) for m in ("eager", "chunked")}
    tensors = _inputs(args.n, args.d, args.v, args.device)
    t = alternated({m: (lambda m=m: _step(m, *tensors, args.chunk_size))
                    for m in ("eager", "chunked")}, args.repeats,
                   torch.device(args.device)).median()
    result = {
        "bench": "loss", "n": args.n, "d": args.d, "v": args.v, "chunk_size": args.chunk_size,
        "dtype": "float32", "device": args.device, "threads": args.threads,
        "eager_peak_mb": round(mem["eager"]["peak_bytes"] / 2**20, 1),
        "chunked_peak_mb": round(mem["chunked"]["peak_bytes"] / 2**20, 1),
        "peak_mem_ratio": round(mem["chunked"]["peak_bytes"] / mem["eager"]["peak_bytes"], 4),
        "eager_s": round(t["eager"], 4), "chunked_s": round(t["chunked"], 4),
        "time_ratio": round(t["chunked"] / t["eager"], 4),
        "loss_abs_diff": abs(mem["chunked"]["loss"] - mem["eager"]["loss"]),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
