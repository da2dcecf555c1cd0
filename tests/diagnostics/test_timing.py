"""The timing harness the device check and ``benchmarks/`` share: warm-up, turns in reversed
order every other round, both clocks, the caller's statistic (no wall-clock assertion)."""

from __future__ import annotations

import torch

from pipeline_lib.diagnostics.timing import Timings, alternated, best_s, median_ms


def test_alternated_warms_up_then_reverses_the_order_every_other_round() -> None:
    calls: list[str] = []

    def fn(name: str):
        def call() -> int:
            calls.append(name)
            return len(calls)
        return call

    t = alternated({"a": fn("a"), "b": fn("b")}, repeats=3, device=torch.device("cpu"))
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert t.last == {"a": 7, "b": 8}  # each function's result of the last round
    assert {k: len(v) for k, v in t.wall.items()} == {"a": 3, "b": 3}
    assert {k: len(v) for k, v in t.cpu.items()} == {"a": 3, "b": 3}
    assert all(s >= 0 for v in [*t.wall.values(), *t.cpu.values()] for s in v)


def test_alternated_without_warm_up_runs_one_round_at_least() -> None:
    calls: list[str] = []
    t = alternated({"a": lambda: calls.append("a")}, repeats=0, warmup=False)
    assert calls == ["a"] and len(t.wall["a"]) == 1


def test_statistics_are_the_callers_choice() -> None:
    t = Timings(wall={"a": [0.003, 0.001, 0.002], "b": [0.5, 0.4, 0.9]},
                cpu={"a": [0.002, 0.004, 0.001], "b": [0.3, 0.2, 0.1]})
    assert t.median() == {"a": 0.002, "b": 0.5}
    assert t.best() == {"a": 0.001, "b": 0.4}
    assert t.median("cpu") == {"a": 0.002, "b": 0.2}
    assert t.best("cpu") == {"a": 0.001, "b": 0.1}
    assert t.median_ms() == {"a": 2.0, "b": 500.0}
    assert t.rounds("cpu") == [{"a": 0.002, "b": 0.3}, {"a": 0.004, "b": 0.2},
                               {"a": 0.001, "b": 0.1}]


def test_median_ms_calls_the_function_once_more_than_repeats() -> None:
    calls: list[int] = []
    assert median_ms(lambda: calls.append(1), repeats=4) >= 0
    assert len(calls) == 5


def test_best_s_is_the_fewest_seconds_of_calls_without_warm_up() -> None:
    calls: list[int] = []
    assert best_s(lambda: calls.append(1), repeats=3) >= 0
    assert len(calls) == 3
