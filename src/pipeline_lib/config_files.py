"""Config files and their merge rules, as plain data: what every entry point shares.

``load_config`` (the stage commands' ``--config A --config B``) and the Snakefile (its
``--configfile A B``) read and stack files by these rules: sections merge key by key, lists
and scalars replace, and a file that lists ``runs:`` replaces the variants before it (a
variant set is one unit). Light: no torch, OmegaConf imported when a file is read.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError


def read_yaml(path: Path) -> Any:
    """The mapping in the YAML file ``path`` (an OmegaConf ``DictConfig``; empty for an
    empty file), or a ConfigError naming the file."""
    from omegaconf import OmegaConf  # imported here: keeps `import pipeline_lib.config` cheap

    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory; pass a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass an existing YAML file")
    try:
        loaded = OmegaConf.load(path)
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start}: "
                          f"{exc.reason}); save it as UTF-8") from None
    except Exception as exc:  # yaml.YAMLError and friends
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from None
    if loaded is None:
        return OmegaConf.create({})
    if not isinstance(loaded, Mapping) and not hasattr(loaded, "keys"):
        raise ConfigError(f"config file {path} must hold a mapping of sections, not a list")
    return loaded


def config_paths(path: str | Path | Sequence[str | Path] | None,
                 base: str | Path | None) -> list[Path]:
    """``path`` as a list of files (one, several, or none), ``base`` itself left out."""
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    return [Path(p) for p in paths
            if base is None or Path(p).resolve() != Path(base).resolve()]


def merge_config_dicts(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Plain-data merge with the loader's rules: mappings merge recursively, lists and
    scalars replace, and a top-level ``runs`` in ``update`` replaces ``base``'s variants."""

    def merge(a: Any, b: Any) -> Any:
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            out = dict(a)
            for key, value in b.items():
                out[key] = merge(a[key], value) if key in a else copy.deepcopy(value)
            return out
        return copy.deepcopy(b)

    merged = merge(base, update)
    if "runs" in update:
        merged["runs"] = copy.deepcopy(update["runs"])
    return merged


def merge_config_files(paths: Sequence[str | Path], default: Path) -> dict[str, Any]:
    """``default`` (the embedded config/config.yaml) ← each of ``paths`` in order, by
    :func:`merge_config_dicts`, each file read as ``load_config`` reads it: plain data,
    unvalidated, equal to what ``load_config(paths)`` resolves."""
    from omegaconf import OmegaConf

    merged: dict[str, Any] = {}
    for file in [Path(default), *config_paths(paths, default)]:
        data = OmegaConf.to_container(read_yaml(file))
        assert isinstance(data, dict)
        merged = merge_config_dicts(merged, data)
    return merged
