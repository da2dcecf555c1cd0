"""The user's own lm-eval tasks (``bench.include_path``), made runnable from any directory.

lm-eval hands a YAML's ``dataset_kwargs.data_files`` to ``datasets.load_dataset`` as
written, so a relative path is looked up in the *working directory*, not next to the YAML.
:func:`prepare_user_tasks` therefore mirrors the user's folder into the bench job's task
directory: every task YAML (and every file it includes) is rewritten with its local data
paths made absolute (resolved against the YAML's own folder first, then the working
directory, see :func:`pipeline_lib.task_yaml.resolve_data_entry`); every other file
(``utils.py`` for ``!function``, prompts, data) is linked, so ``!function`` and relative
``include:`` keep working. The user's folder is never written to.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..task_catalog import UserTasks, scan_include_path
from ..task_yaml import (
    IGNORED_DIRS,
    YamlTag,
    data_path_entries,
    include_targets,
    load_task_yaml,
    resolve_data_entry,
)

log = logging.getLogger(__name__)

USER_TASKS_DIR = "user"  # sub-directory of the bench job's task directory


class _Dumper(yaml.SafeDumper):
    """Safe dumper that writes :class:`YamlTag` values back with their tag (``!function``)."""


def _represent_tag(dumper: yaml.SafeDumper, data: YamlTag) -> yaml.Node:
    if isinstance(data.value, list):
        return dumper.represent_sequence(data.tag, data.value)
    if isinstance(data.value, dict):
        return dumper.represent_mapping(data.tag, data.value)
    return dumper.represent_scalar(data.tag, str(data.value))


_Dumper.add_representer(YamlTag, _represent_tag)


def _set_data_entry(cfg: dict[str, Any], key: str, old: str, new: str) -> None:
    """Replace the data path ``old`` under ``key`` (as yielded by data_path_entries)."""
    if key == "dataset_path":
        cfg["dataset_path"] = new
        return
    kwargs = cfg["dataset_kwargs"]
    name = key.rsplit(".", 1)[1]
    value = kwargs[name]
    if isinstance(value, str):
        kwargs[name] = new if value == old else value
    elif isinstance(value, list):
        kwargs[name] = [new if v == old else v for v in value]
    elif isinstance(value, dict):
        kwargs[name] = {split: (new if v == old else [new if x == old else x for x in v]
                                if isinstance(v, list) else v)
                        for split, v in value.items()}


def rewrite_task_yaml(src: Path, root: Path, mirror: Path) -> str:
    """The text of task file ``src`` (under ``root``) as it is written into ``mirror``:
    relative data paths absolute; includes outside ``root`` absolute, those inside kept."""
    cfg = load_task_yaml(src)
    for key, entry in list(data_path_entries(cfg)):
        if Path(os.path.expanduser(entry)).is_absolute():
            continue
        found = resolve_data_entry(entry, src)
        assert found is not None, "scan_include_path checked every data path"
        _set_data_entry(cfg, key, entry, str(found))
    if "include" in cfg:
        targets = []
        for raw, target in zip(cfg["include"] if isinstance(cfg["include"], list)
                               else [cfg["include"]], include_targets(cfg, src), strict=True):
            resolved = target.resolve()
            if resolved.is_relative_to(root):
                targets.append(str(raw) if not Path(str(raw)).is_absolute()
                               else str(mirror / resolved.relative_to(root)))
            else:
                targets.append(str(resolved))
        cfg["include"] = targets if isinstance(cfg["include"], list) else targets[0]
    return yaml.dump(cfg, Dumper=_Dumper, sort_keys=False, allow_unicode=True)


def prepare_user_tasks(include_path: str, out_dir: Path, key: str = "bench.include_path"
                       ) -> UserTasks:
    """Mirror ``include_path`` into ``out_dir`` (replaced) with absolute data paths; return
    what it defines. Raises ConfigError for a missing or empty folder or a missing data file."""
    scan = scan_include_path(include_path, key)
    root = scan.root.resolve()
    out_dir = Path(out_dir).absolute()
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    configs = set(scan.config_files)
    for src in sorted(root.rglob("*")):
        rel = src.relative_to(root)
        if not src.is_file() or any(p.startswith(".") or p in IGNORED_DIRS for p in rel.parts):
            continue
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.resolve() in configs:
            dest.write_text(rewrite_task_yaml(src.resolve(), root, out_dir))
        else:
            os.symlink(src.resolve(), dest)
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    log.info("user tasks %s from %s → %s", sorted(scan.tasks), include_path, out_dir)
    return scan
