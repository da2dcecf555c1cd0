"""Which lm-eval task names a bench config may list, found without importing lm-eval.

The Snakefile checks ``bench.tasks`` and ``bench.include_path`` before any job starts
(:func:`check_bench_tasks`, called by :class:`pipeline_lib.workflow.plan.WorkflowPlan`), so
a misspelt task fails in a second rather than after training. Names come from three places:

- the built-in ``loopline_*`` tasks (:data:`BUILTIN_TASK_NAMES`);
- the user's task YAMLs under ``bench.include_path`` (parsed: tasks, groups, tags; their
  local data files must exist);
- lm-eval's bundled task YAMLs, located with ``importlib.util.find_spec`` and scanned for
  ``task:``/``group:``/``tag:`` lines (~14k files, ~0.8 s; only when a name is neither built
  in nor the user's; cached on disk per lm-eval installation).

Relative data paths in a user's YAML are resolved against the YAML's own directory, falling
back to the working directory (where lm-eval itself would look); see
:func:`pipeline_lib.task_yaml.resolve_data_entry`. This module stays light: no torch, no mlflow, no lm_eval import.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .fsio import write_text_atomic
from .spec.config import BenchConfig
from .spec.names import BUILTIN_TASK_NAMES, BUILTIN_TASK_PREFIX
from .task_yaml import (
    IGNORED_DIRS,
    check_task_sampling,
    data_path_entries,
    include_targets,
    iter_task_yamls,
    load_task_yaml,
    matching_paths,
    resolve_data_entry,
    resolve_includes,
    task_tags,
)

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- user tasks


@dataclass(frozen=True)
class UserTasks:
    """What a ``bench.include_path`` directory defines."""

    root: Path
    tasks: dict[str, Path]  # task name → the YAML that defines it (runnable leaf tasks)
    other_names: frozenset[str]  # groups and tags defined there (valid in bench.tasks)
    config_files: tuple[Path, ...]  # every task YAML and every file they include
    data_files: tuple[Path, ...]  # local data files their data paths match

    @property
    def names(self) -> set[str]:
        return set(self.tasks) | set(self.other_names)


def scan_include_path(include_path: str, key: str = "bench.include_path") -> UserTasks:
    """Parse the user's task directory; ConfigError when it is missing, holds no task YAML,
    or names a local data file that does not exist."""
    root = Path(os.path.expanduser(include_path))
    if not root.is_dir():
        raise ConfigError(f"{key} = {include_path!r} is not a directory (working "
                          f"directory {Path.cwd()}); point it at the folder of your task YAMLs")
    cache: dict[Path, dict[str, Any]] = {}
    tasks: dict[str, Path] = {}
    others: set[str] = set()
    for path in iter_task_yamls(root):
        cfg = resolve_includes(path, cache)
        if "group" in cfg and "class" not in cfg:
            others.add(str(cfg["group"]))
        elif isinstance(cfg.get("task"), str):
            tasks.setdefault(cfg["task"], path)
            check_task_sampling(cfg, f"{cfg['task']} ({path})")
        else:
            continue  # a template: lm-eval registers neither it nor its tags
        others |= task_tags(cfg)
    if not tasks and not others:
        raise ConfigError(f"{key} = {include_path!r} holds no task YAML (*.yaml "
                          "with a task: name); add your lm-eval task files there or unset it")
    data_files: set[Path] = set()
    for path in cache:
        for field, entry in data_path_entries(load_task_yaml(path)):
            found = resolve_data_entry(entry, path)
            if found is None:
                raise ConfigError(f"task file {path}: {field} {entry!r} matches no file next to "
                                  f"the YAML or in the working directory {Path.cwd()}; fix the "
                                  "path")
            data_files.update(p for p in matching_paths(found) if p.is_file())
            if found.is_dir():
                data_files.update(p for p in found.rglob("*") if p.is_file())
    return UserTasks(root=root, tasks=tasks, other_names=frozenset(others - set(tasks)),
                     config_files=tuple(sorted(cache)), data_files=tuple(sorted(data_files)))


def user_task_inputs(include_path: str) -> list[str]:
    """Every file the user's tasks depend on (Snakemake inputs of the bench rule): the files
    under ``include_path`` (not hidden, not caches), files they include, their data files."""
    if not include_path:
        return []
    scan = scan_include_path(include_path)
    root = scan.root
    files = {p.absolute() for p in root.rglob("*") if p.is_file() and not any(
        part.startswith(".") or part in IGNORED_DIRS for part in p.relative_to(root).parts)}
    files |= {p.absolute() for p in (*scan.config_files, *scan.data_files)}
    return sorted(str(p) for p in files)


# --------------------------------------------------------------------------- installed tasks

_KEY_LINE = re.compile(r"^[\"']?(task|group|tag|include|class)[\"']?:[ \t]*(.*)$")
_LIST_ITEM = re.compile(r"^[ \t]*-[ \t]*(.+?)[ \t]*$")


def _scalar(text: str) -> str:
    text = re.sub(r"[ \t]+#.*$", "", text).strip()
    return text[1:-1] if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"" else text


def _quick_keys(path: Path) -> dict[str, Any]:
    """Top-level task/group/tag/include/class values of a YAML, read line by line (no parse)."""
    out: dict[str, Any] = {}
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    key: str | None = None
    for line in lines:
        match = _KEY_LINE.match(line)
        if match:
            key, value = match.group(1), _scalar(match.group(2))
            if value.startswith("["):
                out[key] = [_scalar(v) for v in value.strip("[]").split(",") if v.strip()]
                key = None
            elif value:
                out[key] = value
                key = None
            else:
                out[key] = []
            continue
        item = _LIST_ITEM.match(line) if key else None
        if item and isinstance(out.get(key), list):
            out[key].append(_scalar(item.group(1)))
        elif line and not line[0].isspace() and not line.startswith("#"):
            key = None
    return out


def _quick_resolved(path: Path, cache: dict[Path, dict[str, Any]], depth: int = 0
                    ) -> dict[str, Any]:
    if path in cache:
        return cache[path]
    own = _quick_keys(path)
    merged: dict[str, Any] = {}
    if depth < 8:  # include chains in lm-eval are short; a cycle stops here
        for target in include_targets(own, path):
            if target.is_file():
                merged.update(_quick_resolved(target, cache, depth + 1))
    merged.update({k: v for k, v in own.items() if k != "include"})
    cache[path] = merged
    return merged


def lm_eval_tasks_dir() -> Path | None:
    """lm-eval's bundled task directory, located without importing lm-eval."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "tasks"


def _names_cache_file(root: Path) -> Path:
    """Per-installation cache file: keyed by the tasks directory and the mtimes of it and of
    lm-eval's ``__init__.py`` (a reinstall or upgrade rewrites both)."""
    init = root.parent / "__init__.py"
    stamp = f"{root.resolve()}|{root.stat().st_mtime_ns}|{init.stat().st_mtime_ns}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "loopline" / f"lm_eval_task_names_{digest}.json"


@functools.lru_cache(maxsize=1)
def installed_task_names() -> frozenset[str]:
    """Task, group and tag names of lm-eval's bundled YAMLs (what ``lm-eval ls tasks`` lists).

    The scan (~0.8 s on 2 CPU cores for ~14k YAMLs; lm-eval's own index takes ~8 s) is cached
    in memory and in ``$XDG_CACHE_HOME/loopline`` (best effort).
    """
    root = lm_eval_tasks_dir()
    if root is None or not root.is_dir():
        return frozenset()
    cache_file = _names_cache_file(root)
    try:
        return frozenset(json.loads(cache_file.read_text()))
    except (OSError, ValueError):
        pass  # no cache yet (or a damaged one): scan and write it
    names = _scan_installed(root)
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(cache_file, json.dumps(sorted(names)))
    except OSError as exc:
        log.debug("cannot cache lm-eval task names in %s (%s)", cache_file, exc)
    return names


def _scan_installed(root: Path) -> frozenset[str]:
    cache: dict[Path, dict[str, Any]] = {}
    names: set[str] = set()
    for path in iter_task_yamls(root):
        cfg = _quick_resolved(path, cache)
        if "group" in cfg and "class" not in cfg and isinstance(cfg["group"], str):
            names.add(cfg["group"])
        elif isinstance(cfg.get("task"), str):
            names.add(cfg["task"])
        else:
            continue
        names |= task_tags(cfg)
    return frozenset(names)


# --------------------------------------------------------------------------- bench.tasks


def selected_tasks(bench: BenchConfig, user: UserTasks | None) -> list[str]:
    """The tasks a bench job runs: ``bench.tasks``, plus every task of ``bench.include_path``
    (in the order of their YAML paths) when ``bench.tasks`` names none of its tasks, groups
    or tags."""
    tasks = list(dict.fromkeys(bench.tasks))
    if user is not None and not user.names.intersection(tasks):
        tasks += [t for t in user.tasks if t not in tasks]
    return tasks


def check_bench_tasks(bench: BenchConfig, key: str = "bench") -> list[str]:
    """Validate ``bench.tasks`` and ``bench.include_path``; the task names a job will run,
    none when both are empty (no downstream benchmarks: the bench job writes an empty report).

    ConfigError (one line, naming ``{key}.tasks`` or ``{key}.include_path``) for an unknown
    name, a missing or empty include_path, or a user data file that does not exist.
    """
    user = (scan_include_path(bench.include_path, f"{key}.include_path")
            if bench.include_path else None)
    reserved = sorted(t for t in (user.tasks if user else ()) if t.startswith(BUILTIN_TASK_PREFIX))
    if reserved:
        raise ConfigError(f"{key}.include_path defines task {reserved[0]!r} in "
                          f"{user.tasks[reserved[0]]}; the {BUILTIN_TASK_PREFIX} prefix is reserved "
                          "for built-in tasks: rename its task:")
    tasks = selected_tasks(bench, user)
    local = set(BUILTIN_TASK_NAMES) | (user.names if user else set())
    unknown = [t for t in tasks if t not in local]
    if unknown:
        unknown = [t for t in unknown if t not in installed_task_names()]
    if unknown:
        where = f", not in {key}.include_path ({bench.include_path})" if user else ""
        raise ConfigError(f"{key}.tasks names unknown task(s) {unknown}: not built in "
                          f"{list(BUILTIN_TASK_NAMES)}{where} and not installed with lm-eval; "
                          "fix the name (`lm-eval ls tasks` lists installed ones) or add its "
                          f"YAML to {key}.include_path")
    return tasks
