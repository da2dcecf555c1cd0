"""Built-in lm-eval task files generated from the ``reasoning`` problem generators.

Each built-in task is one YAML config plus one JSONL data file in a directory handed to
lm-eval as ``include_path``. The data are drawn by :func:`pipeline_lib.data.reasoning.
generate_problems` from ``bench.seed``: a stream per (task, level, seed) of its own, so the
sets never share a random stream with the training documents (those come from the
``loopline-reasoning:{seed}`` stream). Levels run from ``bench.min_difficulty`` to
``bench.max_difficulty``; levels above the training range (``data.sources[*].max_difficulty``,
4 by default) measure depth extrapolation.

Every example carries its ``level`` so per-level accuracy can be read back from lm-eval's
per-sample logs. Examples are interleaved by level, so ``--limit`` keeps every level.
Files are only rewritten when their bytes change, so the datasets cache stays valid.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..data.reasoning import generate_problems
from ..errors import ConfigError
from ..fsio import write_text_atomic
from ..output_paths import check_output_dir
from ..spec.config import BenchConfig, BenchSamplingConfig
from ..spec.names import (
    BUILTIN_TASK_NAMES,
    BUILTIN_TASK_PREFIX,
    REASONING_TASKS,
    SAMPLES_METRIC,
)
from .user_tasks import USER_TASKS_DIR

log = logging.getLogger(__name__)

TASK_TAG = "loopline"
TASK_FORMAT_VERSION = 1


@dataclass(frozen=True)
class BuiltinTask:
    """How one reasoning generator becomes an lm-eval task."""

    name: str  # lm-eval task name
    generator: str  # pipeline_lib.data.reasoning task
    output_type: str  # multiple_choice | generate_until
    metric: str  # the metric scored per sample (acc | exact_match)


# How each reasoning generator is scored: (lm-eval output type, per-sample metric)
_SCORING = {"khop": ("multiple_choice", "acc"), "addition": ("generate_until", "exact_match"),
            "parity": ("multiple_choice", "acc")}
BUILTIN_TASKS: dict[str, BuiltinTask] = {
    name: BuiltinTask(name, generator, *_SCORING[generator])
    for name, generator in zip(BUILTIN_TASK_NAMES, REASONING_TASKS, strict=True)
}

# Generation stops at the first of these (and always at EOS, which ends every training document).
GENERATION_STOPS = ["\n", ";", " "]


def is_builtin(task: str) -> bool:
    """True for the ``loopline_*`` tasks this module writes."""
    return task in BUILTIN_TASKS


def builtin_metric(task: str) -> str:
    """The per-sample metric of a built-in task (``acc`` or ``exact_match``)."""
    return BUILTIN_TASKS[task].metric


def _check_bench(bench: BenchConfig) -> None:
    if bench.min_difficulty > bench.max_difficulty:
        raise ConfigError(f"bench.min_difficulty = {bench.min_difficulty} exceeds bench."
                          f"max_difficulty = {bench.max_difficulty}; swap them")
    unknown = [t for t in bench.tasks if t.startswith(BUILTIN_TASK_PREFIX) and t not in BUILTIN_TASKS]
    if unknown:
        raise ConfigError(f"bench.tasks names unknown built-in task(s) {unknown}; built-ins are "
                          f"{sorted(BUILTIN_TASKS)}")


def task_examples(task: BuiltinTask, bench: BenchConfig) -> list[dict[str, Any]]:
    """The JSONL rows of one built-in task, levels interleaved.

    Multiple-choice rows hold ``choices`` (answer and distractors, shuffled by a seeded
    stream) and the index ``label`` of the answer.
    """
    levels = range(bench.min_difficulty, bench.max_difficulty + 1)
    per_level = {
        level: generate_problems(task.generator, level, bench.examples_per_level, bench.seed)
        for level in levels
    }
    shuffle_rng = random.Random(f"loopline-bench-choices:{task.name}:{bench.seed}")
    rows: list[dict[str, Any]] = []
    for i in range(bench.examples_per_level):
        for level in levels:
            problem = per_level[level][i]
            row: dict[str, Any] = {
                "id": f"{task.generator}-{level}-{i}",
                "level": level,
                "prompt": problem.prompt,
                "answer": problem.answer,
            }
            if task.output_type == "multiple_choice":
                assert problem.distractors, f"{task.generator} problems need distractors"
                choices = [problem.answer, *problem.distractors]
                shuffle_rng.shuffle(choices)
                row["choices"] = choices
                row["label"] = choices.index(problem.answer)
            rows.append(row)
    return rows


def task_config(task: BuiltinTask, data_file: Path, bench: BenchConfig) -> dict[str, Any]:
    """The lm-eval YAML config of one built-in task (plain data, absolute data path)."""
    cfg: dict[str, Any] = {
        "task": task.name,
        "tag": [TASK_TAG],
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data_file.resolve())}},
        "test_split": "test",
        "output_type": task.output_type,
        # Field names (not Jinja templates): prompts are code-like and may contain braces.
        "doc_to_text": "prompt",
        "target_delimiter": "",  # the training document is exactly prompt + answer
        "num_fewshot": 0,
    }
    if task.output_type == "multiple_choice":
        cfg["doc_to_choice"] = "choices"
        cfg["doc_to_target"] = "label"
        cfg["metric_list"] = [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]
    else:
        cfg["doc_to_target"] = "answer"
        cfg["generation_kwargs"] = {
            "until": list(GENERATION_STOPS),
            "max_gen_toks": bench.max_gen_toks,
            "do_sample": False,
        }
        cfg["metric_list"] = [{"metric": "exact_match", "aggregation": "mean",
                               "higher_is_better": True}]
        sampled = sampled_config(bench.sampling)
        cfg["generation_kwargs"].update(sampled.pop("generation_kwargs", {}))
        cfg.update(sampled)
    cfg["metadata"] = {
        "version": TASK_FORMAT_VERSION,
        "seed": bench.seed,
        "levels": list(range(bench.min_difficulty, bench.max_difficulty + 1)),
        "examples_per_level": bench.examples_per_level,
    }
    return cfg


def sampled_config(sampling: BenchSamplingConfig) -> dict[str, Any]:
    """What ``bench.sampling`` changes in a generative built-in task's YAML: lm-eval's
    ``repeats`` and sampling ``generation_kwargs``, and with several answers the metric that
    scores them all (:data:`.sampled.SAMPLES_METRIC`: exact_match of the first, pass@1,
    pass@repeats and maj@repeats) behind a filter that keeps them all. Nothing at the
    defaults (one greedy answer), so the task file stays byte for byte what it was."""
    cfg: dict[str, Any] = {}
    if sampling.temperature > 0:
        cfg["generation_kwargs"] = {"do_sample": True, "temperature": sampling.temperature}
    if sampling.repeats > 1:
        cfg["repeats"] = sampling.repeats
        cfg["filter_list"] = [{"name": "none", "filter": [
            {"function": "take_first_k", "k": sampling.repeats}]}]
        cfg["metric_list"] = [{"metric": SAMPLES_METRIC, "aggregation": "mean",
                               "higher_is_better": True, "k": [1, sampling.repeats]}]
    return cfg


def is_tasks_dir(path: Path) -> bool:
    """Whether every entry of ``path`` is a built-in task file or the user-task folder a
    bench job writes there (so the job may write into it again)."""
    ours = {f"{name}.{ext}" for name in BUILTIN_TASKS for ext in ("yaml", "jsonl")}
    return all(p.name in ours or p.name == USER_TASKS_DIR for p in Path(path).iterdir())


def check_tasks_dir(path: Path) -> None:
    """Before a bench job: ``path`` is new, empty or a bench job's task folder (one line)."""
    check_output_dir(path, "bench task directory", owned=is_tasks_dir,
                     kind="a bench task folder (files other than the built-in tasks' are in "
                          "it)")


def write_builtin_tasks(bench: BenchConfig, out_dir: Path) -> list[str]:
    """Write YAML + JSONL for every built-in task named in ``bench.tasks``.

    Returns the built-in task names written (in ``bench.tasks`` order); other names in
    ``bench.tasks`` are installed lm-eval tasks and need no files.
    """
    _check_bench(bench)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    for name in bench.tasks:
        if name not in BUILTIN_TASKS or name in written:
            continue
        task = BUILTIN_TASKS[name]
        data_file = out_dir / f"{name}.jsonl"
        rows = task_examples(task, bench)
        write_text_atomic(data_file, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows),
                          if_changed=True)
        config = task_config(task, data_file, bench)
        write_text_atomic(out_dir / f"{name}.yaml", yaml.safe_dump(config, sort_keys=False),
                          if_changed=True)
        log.info("built-in task %s: %d examples (levels %d..%d) in %s", name, len(rows),
                 bench.min_difficulty, bench.max_difficulty, data_file)
        written.append(name)
    return written
