"""How lm-eval task YAML files are read: safe parsing that keeps ``!function`` tags,
``include:`` chains merged as lm-eval merges them, the local data paths a task names, and
the sampling it asks for (``generation_kwargs``, ``repeats``, pass@k/maj@k), checked.

Used by :mod:`pipeline_lib.task_catalog` (which names exist) and
:mod:`pipeline_lib.bench.user_tasks` (the mirror a bench job runs from). Light: only PyYAML.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .spec.names import SAMPLES_METRIC

IGNORED_DIRS = frozenset({"__pycache__", ".ipynb_checkpoints"})  # as lm-eval's index
# `datasets` builders that read local files named by data_files/data_dir.
LOCAL_BUILDERS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas", "webdataset"})


# --------------------------------------------------------------------------- YAML files


@dataclass(frozen=True)
class YamlTag:
    """A tagged YAML scalar such as lm-eval's ``!function utils.process_docs``, kept verbatim."""

    tag: str
    value: Any


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """Safe loader that keeps unknown tags (``!function``) as :class:`YamlTag` values."""


def _construct_tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> YamlTag:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return YamlTag(f"!{suffix}", value)


_Loader.add_multi_constructor("!", _construct_tagged)


def load_task_yaml(path: Path) -> dict[str, Any]:
    """One task YAML as a mapping (``include:`` not resolved); ConfigError when unreadable."""
    try:
        with open(path, "rb") as fh:
            data = yaml.load(fh, Loader=_Loader)  # noqa: S506 (a safe loader)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"task file {path} cannot be read as YAML "
                          f"({str(exc).splitlines()[0]}); fix or remove it") from None
    if not isinstance(data, dict):
        raise ConfigError(f"task file {path} must hold a mapping (task:, dataset_path:, …); "
                          "fix or remove it")
    return data


def include_targets(cfg: dict[str, Any], yaml_path: Path) -> list[Path]:
    """Files named by a YAML's ``include:`` (relative to its directory, as lm-eval reads them)."""
    includes = cfg.get("include")
    if includes is None:
        return []
    items = includes if isinstance(includes, list) else [includes]
    return [Path(i) if Path(str(i)).is_absolute() else yaml_path.parent / str(i) for i in items]


def resolve_includes(path: Path, cache: dict[Path, dict[str, Any]], seen: frozenset[Path] = frozenset()
              ) -> dict[str, Any]:
    """The YAML with its includes merged in (included keys first, local keys win)."""
    path = path.resolve()
    if path in cache:
        return cache[path]
    if path in seen:
        raise ConfigError(f"task file {path} includes itself (include cycle); fix its include:")
    own = load_task_yaml(path)
    merged: dict[str, Any] = {}
    for target in include_targets(own, path):
        if not target.is_file():
            raise ConfigError(f"task file {path}: include {target} does not exist; fix the "
                              "include: entry")
        inc = dict(resolve_includes(target, cache, seen | {path}))
        inc.pop("task_list", None)
        merged.update(inc)
    merged.update({k: v for k, v in own.items() if k != "include"})
    cache[path] = merged
    return merged


# --------------------------------------------------------------------------- data paths


def data_path_entries(cfg: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(key, path as written) of every local data path a task YAML names itself.

    ``dataset_kwargs.data_files`` (str, list or split → str/list) and ``data_dir`` count when
    ``dataset_path`` is a local builder (json, csv, parquet, …); a ``dataset_path`` that is
    itself a local directory (``./…``, ``../…``) counts too. Hub datasets are left alone.
    """
    dataset_path = cfg.get("dataset_path")
    if isinstance(dataset_path, str) and dataset_path.startswith(("./", "../", "~")):
        yield "dataset_path", dataset_path
    kwargs = cfg.get("dataset_kwargs")
    if dataset_path not in LOCAL_BUILDERS or not isinstance(kwargs, dict):
        return
    files = kwargs.get("data_files")
    groups = files.values() if isinstance(files, dict) else [files]
    for group in groups:
        for entry in group if isinstance(group, list) else [group]:
            if isinstance(entry, str) and "://" not in entry:
                yield "dataset_kwargs.data_files", entry
    if isinstance(kwargs.get("data_dir"), str):
        yield "dataset_kwargs.data_dir", kwargs["data_dir"]


def matching_paths(path: Path) -> list[Path]:
    """The existing paths ``path`` names: a glob's matches (sorted), else itself if it exists."""
    text = str(path)
    if glob.has_magic(text):
        return sorted(Path(p) for p in glob.glob(text, recursive=True))
    return [path] if path.exists() else []


def resolve_data_entry(entry: str, yaml_path: Path) -> Path | None:
    """Absolute path of a data entry: as written when absolute, else next to the YAML, else in
    the working directory; None when nothing matches (a glob must match a file)."""
    path = Path(os.path.expanduser(entry))
    if path.is_absolute():
        return path if matching_paths(path) else None
    for base in (yaml_path.resolve().parent, Path.cwd()):
        if matching_paths(base / path):
            return (base / path).absolute()
    return None


# --------------------------------------------------------------------------- task folders


def iter_task_yamls(root: Path) -> list[Path]:
    """The ``*.yaml`` files lm-eval's index reads under ``root`` (not ``.yml``), less hidden
    ones (editor and VCS folders; the bench mirror leaves them out too)."""
    return sorted((p for p in root.glob("**/*.yaml") if p.is_file() and not any(
        part.startswith(".") or part in IGNORED_DIRS for part in p.relative_to(root).parts)),
        key=lambda p: p.as_posix())


def task_tags(cfg: dict[str, Any]) -> set[str]:
    """The ``tag:`` names of a task YAML (one or a list)."""
    tags = cfg.get("tag")
    return {str(t) for t in (tags if isinstance(tags, list) else [tags]) if t}


# --------------------------------------------------------------------------- sampling


def _number(task: str, name: str, value: Any, ok: Any, rule: str) -> float:
    """Setting ``name`` of ``task`` as a float passing ``ok``; else one line naming both."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not ok(number):
        raise ConfigError(f"task {task}: {name}={value!r} {rule}; fix it in the task's YAML")
    return number


def _do_sample(task: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"task {task}: generation_kwargs do_sample={value!r} is not a boolean; "
                      "use true or false in the task's YAML")


def generation_draw(gen_kwargs: dict[str, Any], task: str = "unknown"
                    ) -> tuple[float, float, int | None] | None:
    """(temperature, top_p, top_k) of the draw ``gen_kwargs`` ask for, as Hugging Face's
    ``generate`` reads them; None: greedy. ``do_sample: true`` samples (temperature 1 unless
    given), ``do_sample: false`` is greedy whatever the temperature, and without
    ``do_sample`` a temperature above 0 samples. Every kwarg is checked whichever applies:
    ConfigError naming ``task`` and the kwarg."""
    do_sample = _do_sample(task, gen_kwargs.get("do_sample"))
    raw_t = gen_kwargs.get("temperature")
    temperature = 1.0 if raw_t is None and do_sample else _number(
        task, "generation_kwargs temperature", 0.0 if raw_t is None else raw_t,
        lambda t: t >= 0 and math.isfinite(t), "must be a number >= 0 (0 = greedy)")
    top_p = _number(task, "generation_kwargs top_p", 1.0 if gen_kwargs.get("top_p") is None
                    else gen_kwargs["top_p"], lambda p: 0 < p <= 1,
                    "must lie in (0, 1] (1 = no cut)")
    top_k = gen_kwargs.get("top_k")
    if top_k is not None:
        top_k = int(_number(task, "generation_kwargs top_k", top_k,
                            lambda k: k >= 1 and k == int(k),
                            "must be a whole number >= 1 (leave it out: no cut)"))
    if do_sample is False or temperature == 0:
        return None
    return temperature, top_p, top_k


def _ks(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def check_task_sampling(cfg: dict[str, Any], task: str) -> None:
    """A task config's sampling (merged with its includes): ``repeats`` a whole number ≥ 1,
    its ``generation_kwargs`` (:func:`generation_draw`), and no k of the
    ``loopline_samples`` metric or of a ``take_first_k`` filter above ``repeats``."""
    repeats = int(_number(task, "repeats", cfg.get("repeats", 1),
                          lambda n: n >= 1 and n == int(n), "must be a whole number >= 1"))
    kwargs = cfg.get("generation_kwargs")
    if isinstance(kwargs, dict):
        generation_draw(kwargs, task)
    metrics = [m for m in cfg.get("metric_list") or [] if isinstance(m, dict)]
    ks = [("metric " + SAMPLES_METRIC, k) for m in metrics if m.get("metric") == SAMPLES_METRIC
          for k in _ks(m.get("k", 1))]
    ks += [(f"filter {entry.get('name')!r} take_first_k", f.get("k"))
           for entry in cfg.get("filter_list") or [] if isinstance(entry, dict)
           for f in entry.get("filter") or [] if isinstance(f, dict)
           and f.get("function") == "take_first_k"]
    for where, k in ks:
        _number(task, f"{where} k", k, lambda x: 1 <= x <= repeats and x == int(x),
                f"must be a whole number from 1 to repeats={repeats} (the answers sampled per "
                "question)")
