"""Per-example lm-eval results of the built-in tasks, for comparing two models example by
example (imported by name from ``support``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def per_example(lm: Any, manager: Any, tasks: Sequence[str]) -> dict[str, list[tuple]]:
    """``{task: [(doc_id, main metric, filtered responses)]}`` sorted by doc_id
    (``loopline_khop``: acc; the generation tasks: exact_match)."""
    import lm_eval

    results = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager,
                                      log_samples=True, bootstrap_iters=0)
    out = {}
    for task in tasks:
        samples = sorted(results["samples"][task], key=lambda s: s["doc_id"])
        metric = "acc" if task == "loopline_khop" else "exact_match"
        out[task] = [(s["doc_id"], s[metric], s["filtered_resps"]) for s in samples]
    return out
