"""Side-by-side timing: the one harness of the device check and of ``benchmarks/``.

Performance claims are ratios of runs measured in turns in one process (STYLE.md): each
function is called once to warm up (compiles, allocator, caches), then once per round, the
order reversed every other round so that a drift in the machine's load falls on every
function alike. Each call is fenced by a device synchronisation (queued kernels are counted),
and both its wall time and the process's CPU time are kept: CPU time is what the call itself
cost, much less disturbed than wall time by other work on a shared machine. The caller picks
the statistic: the median (typical) or the best (the cost without interference).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..device import synchronize


@dataclass
class Timings:
    """Seconds per round of every timed function (``wall`` and process ``cpu``), in the order
    of the rounds, and each function's last result (``last``)."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)

    def median(self, clock: str = "wall") -> dict[str, float]:
        """Median seconds of each function on ``clock`` (``wall`` or ``cpu``)."""
        return {name: statistics.median(t) for name, t in getattr(self, clock).items()}

    def best(self, clock: str = "wall") -> dict[str, float]:
        """Fewest seconds of each function on ``clock`` (``wall`` or ``cpu``)."""
        return {name: min(t) for name, t in getattr(self, clock).items()}

    def median_ms(self) -> dict[str, float]:
        """Median wall milliseconds of each function, rounded to µs."""
        return {name: round(s * 1000, 3) for name, s in self.median().items()}

    def rounds(self, clock: str = "wall") -> list[dict[str, float]]:
        """Seconds of every function per round: one dict per round."""
        times = getattr(self, clock)
        return [dict(zip(times, r, strict=True)) for r in zip(*times.values(), strict=True)]


def alternated(fns: dict[str, Callable[[], Any]], repeats: int,
               device: torch.device | None = None, warmup: bool = True) -> Timings:
    """Time each of ``fns`` once per round over ``repeats`` rounds (at least one), in turns,
    the order reversed every other round, after one warm-up call each (``warmup``).
    ``device``: synchronised before and after every call (None: the CPU, nothing queued)."""
    sync = (lambda: synchronize(device)) if device is not None else (lambda: None)
    out = Timings({name: [] for name in fns}, {name: [] for name in fns})
    if warmup:
        out.last = {name: fn() for name, fn in fns.items()}
    for r in range(max(1, repeats)):
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            sync()
            started, cpu_started = time.perf_counter(), time.process_time()
            out.last[name] = fns[name]()
            sync()
            out.cpu[name].append(time.process_time() - cpu_started)
            out.wall[name].append(time.perf_counter() - started)
    return out


def median_ms(fn: Callable[[], Any], device: torch.device | None = None,
              repeats: int = 3) -> float:
    """Median wall time of ``fn`` in ms over ``repeats`` calls after one warm-up call."""
    return alternated({"fn": fn}, repeats, device).median_ms()["fn"]


def best_s(fn: Callable[[], Any], repeats: int, warmup: bool = False) -> float:
    """Fewest wall seconds of ``fn`` over ``repeats`` calls (no warm-up unless ``warmup``:
    the first call's cost, e.g. a cold page cache, is part of what the caller measures)."""
    return alternated({"fn": fn}, repeats, warmup=warmup).best()["fn"]
