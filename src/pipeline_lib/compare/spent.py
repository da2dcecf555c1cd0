"""Compute spent per depth setting: what the comparison sets accuracy against.

A bench JSON records, per task and setting (each fixed H_eff, each adaptive exit), the loops
used per token (a token's exit loop) and, since compute spent is reported, the loops actually
computed per token (``loops.computed_mean``: a generated token decoded through the cache
computes only its own loops, a scored token computes MAX whatever its exit), the largest KV
cache of the task's generative requests (``kv_bytes``, ``kv_bytes_core``) and the setting's
wall time over all tasks (``setting_seconds``). :func:`.markdown.depth_settings` lines them
up per run and task for the table and the figure; a fixed H_eff computes H_eff loops for every
token.

Bench JSONs written before loops computed were recorded have no ``computed_mean``: their
adaptive settings fall back to the loops used (``computed_known`` False), which is what a
cached decoder would have spent on their generated tokens; their scored tokens computed MAX.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Spent:
    """What one setting cost: wall time of the setting (all tasks), the task's largest KV
    cache of its generative requests and its core blocks' part (None where not recorded)."""

    seconds: float | None = None
    kv_bytes: int | None = None
    kv_bytes_core: int | None = None


def read_spent(bench: Mapping[str, Any]) -> dict[str, dict[str, Spent]]:
    """``task/metric`` → setting (``"4"`` or ``adaptive:T:MAX``) → :class:`Spent` of one
    bench JSON; settings with nothing recorded are left out."""
    seconds = bench.get("setting_seconds") or {}
    out: dict[str, dict[str, Spent]] = {}
    for task, info in bench.get("tasks", {}).items():
        cells = {**info.get("h_eff", {}), **(info.get("adaptive") or {})}
        for setting, scores in cells.items():
            spent = Spent(seconds.get(setting), scores.get("kv_bytes"),
                          scores.get("kv_bytes_core"))
            if spent != Spent():
                out.setdefault(f"{task}/{info.get('metric')}", {})[setting] = spent
    return out


def spent_rows(spent: Mapping[str, Mapping[str, Spent]],
               adaptive_scores: Mapping[str, Mapping[str, Mapping[Any, Any]]]
               ) -> Iterator[tuple[str, int, float]]:
    """(metric, h_eff, value) rows of the comparison table for what each setting spent
    (``spent``: a run's :func:`read_spent`; ``adaptive_scores``: its adaptive scores, whose
    MAX is an adaptive row's h_eff): ``{task}/kv_bytes[_core]`` at a fixed H_eff, ``…_{adaptive}`` under an adaptive exit,
    ``bench/seconds[_{adaptive}]`` once per setting (all tasks)."""
    seconds: dict[tuple[str, int], float] = {}
    for key, settings in sorted(spent.items()):
        task = key.rsplit("/", 1)[0]
        for setting, s in settings.items():
            is_adaptive = not setting.isdigit()
            h = _max_loops(adaptive_scores, key, setting) if is_adaptive else int(setting)
            suffix = f"_{setting}" if is_adaptive else ""
            for name, value in (("kv_bytes", s.kv_bytes), ("kv_bytes_core", s.kv_bytes_core)):
                if value is not None:
                    yield f"{task}/{name}{suffix}", h, float(value)
            if s.seconds is not None:
                seconds[(f"bench/seconds{suffix}", h)] = s.seconds
    for (metric, h), value in sorted(seconds.items()):
        yield metric, h, value


def _max_loops(adaptive: Mapping[str, Mapping[str, Mapping[Any, Any]]], key: str, label: str
               ) -> int:
    cells = adaptive.get(key, {}).get(label, {})
    if None in cells:
        return cells[None].max_loops
    return int(label.rsplit(":", 1)[-1])
