"""Run the downstream benchmarks of one snapshot at every H_eff and write its JSON.

One model is loaded and every task is scored through ``lm_eval.simple_evaluate`` once per
H_eff (the wrapper's ``h_eff`` is switched between calls), then once per adaptive-exit
threshold of every criterion (``bench.adaptive``: ``h_eff=adaptive:[CRITERION:]T:MAX``), whose scores
go to each task's ``adaptive`` section with the loops used and computed (:mod:`.loops_used`).
Every setting records what it spent: each task's largest KV cache of its generative requests
(``kv_bytes``, ``kv_bytes_core``) and the setting's wall time over all tasks
(``setting_seconds``), and a generative task its loops computed per answer with its
sampled scores (pass@k, maj@k: :mod:`.sampled`; answers seeded by ``bench.seed``). Built-in
``loopline_*`` tasks are written first (YAML + JSONL) and scored per difficulty level from
lm-eval's per-sample logs; the user's tasks (``bench.include_path``, mirrored with absolute
data paths by :mod:`.user_tasks`) and installed lm-eval tasks are scored overall, and per
level too when their documents carry ``bench.level_field``. A config with no benchmarks
(``bench.tasks: []``, no ``bench.include_path``) gets the same JSON with ``"tasks": {}``,
written from the snapshot's config and trainer state alone, in seconds.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import lm_eval
from lm_eval.tasks import TaskManager

from ..errors import ConfigError
from ..evaluate.exit.spec import ExitSpec
from ..evaluate.loading import snapshot_record
from ..fsio import output_file_problem, write_text_atomic
from ..spec.config import BenchConfig
from ..task_catalog import check_bench_tasks
from .lm_wrapper import LooplineLM
from .loops_used import loops_summary
from .sampled import sampled_scores
from .scoring import (
    add_paired_comparisons,
    chance_level,
    per_sample_metric,
    sample_levels,
    task_scores,
)
from .tasks import BUILTIN_TASKS, builtin_metric, is_builtin, write_builtin_tasks
from .user_tasks import USER_TASKS_DIR, prepare_user_tasks

log = logging.getLogger(__name__)

BOOTSTRAP_ITERS = 1000  # only non-mean metrics of passed-through tasks bootstrap; means are closed-form


def _train_max_difficulty(cfg: Any) -> int | None:
    """Top of the difficulty range the snapshot's reasoning training data covered (a heldout
    source's documents were never trained on)."""
    if cfg is None:
        return None
    levels = [s.max_difficulty for s in cfg.data.sources
              if s.type == "reasoning" and not s.heldout]
    return max(levels) if levels else None


def task_manager_for(tasks: Sequence[str], tasks_dir: Path, local: Collection[str] = ()) -> Any:
    """A TaskManager over the task files in ``tasks_dir`` (built-in and the user's, whose
    names are ``local``); lm-eval's own index only when needed.

    Indexing lm-eval's ~15k bundled task configs costs seconds, so it is skipped when every
    requested task is built in or the user's.
    """
    needs_defaults = any(not is_builtin(t) and t not in local for t in tasks)
    manager = TaskManager(include_path=str(Path(tasks_dir).resolve()),
                          include_defaults=needs_defaults)
    known = set(manager.all_tasks)
    missing = [t for t in tasks if t not in known]
    if missing:
        raise ConfigError(f"bench.tasks names unknown lm-eval task(s) {missing}; use built-ins "
                          f"{sorted(BUILTIN_TASKS)} or names from `lm-eval ls tasks`")
    return manager


def _has_levels(results: Any, task: str, level_field: str) -> bool:
    return any(s["doc"].get(level_field) is not None for s in results["samples"].get(task, []))


def _scores_of(info: dict[str, Any], results: Any, name: str, level_field: str
               ) -> dict[str, Any]:
    """One task's scores in ``results`` (one setting); fills the task's metric, levels,
    chance and output type in ``info`` the first time."""
    if not info["builtin"] and "levelled" not in info:
        info["levelled"] = _has_levels(results, name, level_field)
        info["metric"] = per_sample_metric(results, name)
        info["levelled"] = info["levelled"] and info["metric"] is not None
    levels = info["builtin"] or info["levelled"]
    field = "level" if info["builtin"] else level_field
    scores = task_scores(results, name, info["metric"] if levels else None, field,
                         sample_metric=info["metric"])
    if levels and "chance" not in info:
        info["chance"] = chance_level(results["samples"][name])
        info["n"] = len(results["samples"][name])
        info["sample_levels"] = sample_levels(results["samples"][name], field)
    if info["output_type"] is None:
        info["output_type"] = results["configs"].get(name, {}).get("output_type")
    sampled = sampled_scores(results["samples"].get(name) or [],
                             results["configs"].get(name, {}), info["metric"],
                             field if levels else None)
    if sampled:
        scores["sampled"] = sampled
    return scores


def _add_spent(scores: dict[str, Any], lm: Any, name: str) -> None:
    """What a task's setting spent: its largest KV cache and, where it generated, the loops
    computed per sampled answer and per answer of each sampled score (× its samples)."""
    scores.update(lm.loops_used.cache_bytes(name))
    per_answer = lm.loops_used.loops_per_answer(name)
    if per_answer is not None:
        scores["loops_per_answer"] = per_answer
        for entry in (scores.get("sampled") or {}).values():
            entry["loops_per_answer"] = entry["samples"] * per_answer


def evaluate_lm(lm: Any, tasks: Sequence[str], manager: Any, h_effs: Sequence[int],
                limit: int = 0, level_field: str = "level", adaptive: Sequence[str] = (),
                seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """Scores of ``lm`` on ``tasks`` at each H_eff, and at each ``adaptive:T:MAX`` of
    ``adaptive`` (each task's ``adaptive`` section, keyed by the canonical ``lm.h_eff``,
    with the loops used per task and level): the ``tasks`` part of the bench JSON.
    ``seconds`` receives each setting's wall time (all tasks together), keyed as the sections.

    Built-in tasks are broken down by their ``level``; any other task by ``level_field`` when
    its documents carry it, scored by :func:`.scoring.per_sample_metric` (its ``metric``)."""
    out: dict[str, Any] = {}
    seconds = {} if seconds is None else seconds
    for name in tasks:
        builtin = is_builtin(name)
        out[name] = {"builtin": builtin, "metric": builtin_metric(name) if builtin else None,
                     "output_type": BUILTIN_TASKS[name].output_type if builtin else None,
                     "h_eff": {}}
    for setting in [*h_effs, *adaptive]:
        lm.h_eff = setting
        lm.reset_loop_stats()
        section = "adaptive" if ExitSpec.is_text(setting) else "h_eff"
        key = str(lm.h_eff)
        started = time.perf_counter()
        results = lm_eval.simple_evaluate(
            model=lm, tasks=list(tasks), task_manager=manager, limit=limit or None,
            log_samples=True, bootstrap_iters=BOOTSTRAP_ITERS)
        assert results is not None, "single-process evaluation always returns results"
        seconds[key] = round(time.perf_counter() - started, 3)
        for name in tasks:
            info = out[name]
            scores = _scores_of(info, results, name, level_field)
            if section == "adaptive":
                used = lm.loops_used
                scores["loops"] = loops_summary(used.documents(name), lm.adaptive.max_loops,
                                                info.get("sample_levels"),
                                                generated=used.documents(name, generated=True))
            _add_spent(scores, lm, name)
            info.setdefault(section, {})[key] = scores
        log.info("bench h_eff=%s: %s (%.1f s)", key, {
            n: out[n][section][key]["overall"].get(out[n]["metric"] or "", None)
            for n in tasks}, seconds[key])
    for info in out.values():  # H_eff against H_eff, on the same examples
        add_paired_comparisons(info)
    return out


def _check_outputs(tasks_dir: Path, out_json: Path | None) -> None:
    """``--out`` and ``--tasks-dir`` writable in kind, before a task file is written."""
    problem = output_file_problem(out_json) if out_json is not None else None
    if problem:
        raise ConfigError(f"cannot write the benchmark scores to {out_json}: {problem}; pass "
                          "--out a JSON file path (e.g. bench/step_NNNNNNN.json)")
    problem = output_file_problem(tasks_dir, directory=True)
    if problem:
        raise ConfigError(f"cannot write the task files to {tasks_dir}: {problem}; pass "
                          "--tasks-dir a directory (default: tasks/ beside --out)")


def adaptive_settings(bench: BenchConfig, h_effs: Sequence[int]) -> list[str]:
    """``adaptive:[CRITERION:]THRESHOLD:MAX`` of every exit of ``bench.adaptive``
    (:meth:`ExitSpec.from_config`): criteria in order, each one's distinct thresholds in
    increasing order; the first criterion is the model's default and goes unnamed. MAX is
    ``bench.adaptive.max_loops``, or the largest H_eff when 0."""
    specs = ExitSpec.from_config(bench.adaptive)
    return [point.text(specs[0].criterion) for spec in specs
            for point in spec.with_max_loops(max(h_effs)).points()]


def _report_head(snapshot_dir: Path, bench: BenchConfig, h_effs: Sequence[int],
                 step: int | None, cfg: Any) -> dict[str, Any]:
    """The bench JSON's description of what was benchmarked: the snapshot, its step and
    training, the H_eff list and the bench settings."""
    return {
        "step": step,
        "snapshot": str(Path(snapshot_dir).resolve()),
        "h_eff": list(h_effs),
        "train_loops": cfg.model.loops if cfg is not None else None,
        "train_max_difficulty": _train_max_difficulty(cfg),
        "bench": {"seed": bench.seed, "examples_per_level": bench.examples_per_level,
                  "min_difficulty": bench.min_difficulty, "max_difficulty": bench.max_difficulty,
                  "limit": bench.limit, "max_gen_toks": bench.max_gen_toks,
                  "include_path": bench.include_path, "level_field": bench.level_field,
                  # the keys' names before bench.adaptive (the JSON keeps its format)
                  "adaptive_thresholds": list(bench.adaptive.thresholds),
                  "adaptive_criterion": bench.adaptive.criteria[0],
                  "adaptive_max_loops": bench.adaptive.max_loops,
                  "sampling": dataclasses.asdict(bench.sampling)},
        "lm_eval_version": getattr(lm_eval, "__version__", None),
    }


def _score_snapshot(snapshot_dir: Path, bench: BenchConfig, tasks: Sequence[str],
                    tasks_dir: Path, h_effs: Sequence[int], adaptive: Sequence[str], *,
                    device: str, precision: str) -> dict[str, Any]:
    """Every task scored on the loaded snapshot: the bench JSON but for ``adaptive``."""
    user = (prepare_user_tasks(bench.include_path, tasks_dir / USER_TASKS_DIR)
            if bench.include_path else None)
    manager = task_manager_for(tasks, tasks_dir, user.names if user else ())
    lm = LooplineLM(snapshot=str(snapshot_dir), h_eff=h_effs[0], batch_size=bench.batch_size,
                    max_gen_toks=bench.max_gen_toks, device=device, precision=precision,
                    adaptive_criterion=bench.adaptive.criteria[0], seed=bench.seed)
    started = time.perf_counter()
    setting_seconds: dict[str, float] = {}
    scores = evaluate_lm(lm, tasks, manager, h_effs, bench.limit, bench.level_field, adaptive,
                         setting_seconds)
    return {**_report_head(snapshot_dir, bench, h_effs, lm.step, lm.config),
            "seconds": round(time.perf_counter() - started, 3),
            "setting_seconds": setting_seconds, "tasks": scores}


def _empty_report(snapshot_dir: Path, bench: BenchConfig, h_effs: Sequence[int]
                  ) -> dict[str, Any]:
    """The bench JSON of a config without benchmarks: the same description, no task, and
    neither the model nor lm-eval's evaluator loaded."""
    log.info("bench: no downstream benchmarks configured (bench.tasks is empty and "
             "bench.include_path is not set); writing a report without tasks")
    step, cfg = snapshot_record(Path(snapshot_dir))
    return {**_report_head(snapshot_dir, bench, h_effs, step, cfg), "seconds": 0.0,
            "setting_seconds": {}, "tasks": {}}


def run_benchmarks(snapshot_dir: Path, bench: BenchConfig, tasks_dir: Path, out_json: Path | None,
                   h_effs: Sequence[int] | None = None, *, device: str = "cpu",
                   precision: str = "fp32") -> dict[str, Any]:
    """Benchmark the snapshot at ``snapshot_dir`` at each H_eff; write and return the JSON.

    ``h_effs`` defaults to ``bench.h_eff``. ``tasks_dir`` receives the built-in task files.
    The model runs on ``device`` in ``precision`` (``experiment.device``/``.precision``).
    With no task configured (``bench.tasks`` empty, no ``bench.include_path``) the JSON has
    ``"tasks": {}`` and the model is not loaded.
    """
    h_effs = [int(h) for h in (h_effs if h_effs is not None else bench.h_eff)]
    if not h_effs or min(h_effs) < 1:
        raise ConfigError(f"bench H_eff list {h_effs} must be non-empty with every value >= 1")
    tasks = check_bench_tasks(bench)
    _check_outputs(Path(tasks_dir), out_json)
    write_builtin_tasks(bench, Path(tasks_dir))  # without built-in tasks: the folder alone
    adaptive = adaptive_settings(bench, h_effs)
    report = (_score_snapshot(Path(snapshot_dir), bench, tasks, Path(tasks_dir), h_effs,
                              adaptive, device=device, precision=precision)
              if tasks else _empty_report(Path(snapshot_dir), bench, h_effs))
    if adaptive:
        report["adaptive"] = adaptive
    if out_json is not None:
        out_json = Path(out_json)
        out_json.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out_json, json.dumps(report, indent=1, sort_keys=True) + "\n")
        log.info("bench results → %s", out_json)
    return report
