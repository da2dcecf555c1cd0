"""Downstream benchmarks through lm-evaluation-harness.

Importing this package registers the ``loopline`` model with lm-eval (``--model loopline``).

- :mod:`.lm_wrapper`: ``LooplineLM``, the lm-eval ``LM`` over a snapshot at a chosen H_eff.
- :mod:`.model_args`: its ``--model_args``, checked before anything loads.
- :mod:`.lm_requests`: lm-eval requests → scoring windows, generation settings, answer seeds.
- :mod:`.lm_generation`: its ``generate_until``, greedy or sampled, each answer seeded.
- :mod:`.sampled`: pass@k, maj@k and lm-eval's filters over several sampled answers.
- :mod:`.loading`: snapshot → model, config and tokenizer.
- :mod:`.tasks`: built-in ``loopline_*`` task files (YAML + JSONL) from the reasoning generators.
- :mod:`.runner`: ``run_benchmarks`` (every task at every H_eff → one JSON per snapshot).
- :mod:`.scoring`: per-level scores, ``summarize_bench`` (parquet + the :mod:`.heatmap`
  figure), the stage's MLflow metrics.
- :mod:`.loops_used`: loops used per token under adaptive exit, per task, document and level.
"""

from __future__ import annotations

# lm-eval registers its own models lazily only while its registry is empty: make sure they are
# registered before ours, so `--model hf` & co. keep working next to `--model loopline`.
import lm_eval.models  # noqa: F401

from .lm_wrapper import LooplineLM
from .runner import run_benchmarks
from .scoring import summarize_bench
from .tasks import BUILTIN_TASKS, write_builtin_tasks

__all__ = ["BUILTIN_TASKS", "LooplineLM", "run_benchmarks", "summarize_bench",
           "write_builtin_tasks"]
