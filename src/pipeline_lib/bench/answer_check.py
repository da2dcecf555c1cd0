"""Exact-match accuracy of greedy answers under one decoding setting, and the threshold pick.

What ``benchmarks/bench_generate.py --snapshot`` sets against compute: the built-in
reasoning problems (:func:`.tasks.task_examples`, the bench stage's own sets from
``bench.seed``) are answered by greedy generation through the KV cache
(:func:`pipeline_lib.evaluate.generation.generate_texts`: the same decoder as ``generate``,
with its ``kv_share`` and adaptive exits) and scored as the built-in generative task is: the
text up to the first stop string (:data:`.tasks.GENERATION_STOPS`) must equal the answer.
Multiple-choice tasks are answered by generation here too (their answer is a literal).

Every setting answers the same examples, so a setting is judged against the reference
(fixed depth at MAX, ``per_loop``) on paired examples: accuracy with its 95% Wilson interval
and the paired difference with its 95% percentile-bootstrap interval
(:mod:`pipeline_lib.evaluate.stats`). :func:`pick_threshold` chooses, among adaptive
thresholds, the one that computes the fewest loops per token while its accuracy stays inside
the reference's interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from ..evaluate.generation import CacheOptions, Depth, generate_texts
from ..evaluate.stats import paired_bootstrap, score_interval
from ..spec.config import BenchConfig
from .lm_requests import cut_at_stops
from .tasks import BUILTIN_TASKS, GENERATION_STOPS, is_builtin, task_examples


def snapshot_task(bench: BenchConfig) -> str:
    """The first built-in task the snapshot is benchmarked on (``bench.tasks``): the demo
    trains on k-hop problems and benchmarks ``loopline_khop``."""
    task = next(filter(is_builtin, bench.tasks), None)
    if task is None:
        raise ConfigError(f"--task: the snapshot's bench.tasks {list(bench.tasks)} name no "
                          f"built-in task; pass --task with one of {sorted(BUILTIN_TASKS)}")
    return task


def answer_examples(bench: BenchConfig, task: str, per_level: int) -> list[dict[str, Any]]:
    """``per_level`` examples of built-in ``task`` per level of ``bench`` (levels
    interleaved, as the bench stage writes them)."""
    if task not in BUILTIN_TASKS:
        raise ConfigError(f"--task {task!r} is not a built-in task; use one of "
                          f"{sorted(BUILTIN_TASKS)}")
    if per_level < 1:
        raise ConfigError(f"--examples {per_level} must be at least 1 (examples per level)")
    return task_examples(BUILTIN_TASKS[task], replace(bench, examples_per_level=per_level))


@dataclass
class AnswerRun:
    """One setting's answers: 0/1 per example, loops computed per generated token, the
    largest KV cache (all slots, core blocks' slots)."""

    correct: list[float]
    loops: float
    kv_bytes: int
    kv_bytes_core: int

    @property
    def accuracy(self) -> float:
        return sum(self.correct) / max(len(self.correct), 1)

    def interval(self) -> tuple[float, float]:
        """95% Wilson interval of the accuracy."""
        return score_interval(self.correct)


def answer_accuracy(model: Any, tok: Any, examples: Sequence[dict[str, Any]], *, depth: Depth,
                    cache: CacheOptions, context_len: int, max_gen_toks: int,
                    batch_size: int) -> AnswerRun:
    """Greedy answers to ``examples`` (``prompt``/``answer``) at ``depth`` with ``cache``."""
    out = generate_texts(model, tok, [e["prompt"] for e in examples], context_len=context_len,
                         max_new_tokens=max_gen_toks, depth=depth, batch_size=batch_size,
                         cache=cache)
    correct = [float(cut_at_stops(g.text, GENERATION_STOPS)[0] == e["answer"])
               for g, e in zip(out, examples, strict=True)]
    steps = sum(g.steps for g in out)
    loops = sum(g.mean_loops * g.steps for g in out) / max(steps, 1)
    return AnswerRun(correct, loops, max(g.kv_bytes for g in out),
                     max(g.kv_bytes_core for g in out))


def against(reference: AnswerRun, run: AnswerRun) -> dict[str, Any]:
    """``run`` beside ``reference`` on the same examples: accuracies with 95% intervals, the
    paired difference run − reference [95% interval], and whether the accuracy lies inside
    the reference's interval."""
    lo, hi = run.interval()
    ref_lo, ref_hi = reference.interval()
    diff = paired_bootstrap(run.correct, reference.correct)
    return {"n": len(run.correct), "accuracy": run.accuracy, "ci_low": lo, "ci_high": hi,
            "reference_accuracy": reference.accuracy, "reference_ci": [ref_lo, ref_hi],
            "diff": diff.diff, "diff_lo": diff.lo, "diff_hi": diff.hi,
            "inside_reference_interval": bool(ref_lo <= run.accuracy <= ref_hi)}


def pick_threshold(runs: dict[str, AnswerRun], reference: AnswerRun) -> str | None:
    """Among ``runs`` (threshold → its answers), the one whose accuracy lies inside the
    reference's 95% interval with the fewest loops computed per token (ties: the first
    given); None when none stays inside."""
    lo, hi = reference.interval()
    inside = [t for t, run in runs.items() if lo <= run.accuracy <= hi]
    return min(inside, key=lambda t: runs[t].loops) if inside else None
