"""OmegaConf's errors while a config is merged or resolved, as one line each; and
:func:`omegaconf`, the package itself, imported on first use by every config module.

:mod:`pipeline_lib.spec.config_load` calls :func:`explain_omegaconf_error` for every OmegaConf
exception; the root dataclass comes in as an argument (this module sits below
:mod:`pipeline_lib.spec.config` in the layers and imports nothing of it). Three kinds: an unknown
key (with the closest existing key), an interpolation (``${…}``) that does not resolve,
and a value of the wrong type.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import typing
from collections.abc import Mapping
from types import ModuleType
from typing import Any


def omegaconf() -> ModuleType:
    """The ``omegaconf`` package, imported on first use: it costs as much again as the rest
    of the config modules (~60 ms), and the code that only needs the dataclasses never uses it."""
    import omegaconf  # lazy: see the docstring

    return omegaconf


def explain_omegaconf_error(exc: Exception, source: str, root: type, data: Any = None) -> str:
    """One line for an OmegaConf error met reading ``source``; ``root``: the config's
    dataclass (for the key suggestion); ``data``: the config (or update) being read, whose
    unresolved value at the error's key tells an interpolation from a wrong type."""
    key = getattr(exc, "full_key", None)
    msg = (getattr(exc, "msg", None) or str(exc)).splitlines()[0]
    if not key:  # a whole section or list of the wrong kind: OmegaConf names no key
        return mistyped_section(source, root, data) or (
            f"{source}: bad value in the config: {msg}; fix the value's type")
    raw = _raw_value(data, key) if data is not None else None
    if isinstance(raw, str) and "${" in raw:
        return (f"{source}: config key '{key}' = {raw!r} is an interpolation that does not "
                f"resolve ({msg}); refer to an existing key (${{section.key}}) or write the "
                "value itself")
    if "not in struct" in str(exc) or "Key '" in msg and "not" in msg:
        section = key.rsplit(".", 1)[0] if "." in key else "the top level"
        guess = _similar_key(key, root)
        hint = f" (did you mean '{guess}'?)" if guess else ""
        return (f"{source}: unknown config key '{key}'{hint}; check its spelling against "
                f"workflow/schemas/config.schema.yaml (keys allowed in {section})")
    return f"{source}: bad value for config key '{key}': {msg}; fix the value's type"


def mistyped_section(source: str, root: type, data: Any) -> str | None:
    """One line for the first section (a dataclass field) given as something other than a
    mapping, or list given as a mapping, in ``data`` (the update being merged); None when
    there is none."""
    found = _mistyped(_plain(data), root, "")
    if found is None:
        return None
    key, value, want = found
    return (f"{source}: config key '{key}' must be {want}, not {type(value).__name__} "
            f"{value!r}; write it as {_shape(want, key)}")


def _plain(cfg: Any) -> Any:
    """``cfg`` as plain data, unresolved (an OmegaConf container converted, else as is)."""
    lib = omegaconf()
    return lib.OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, lib.Container) \
        else cfg


def _mistyped(data: Any, cls: Any, prefix: str) -> tuple[str, Any, str] | None:
    if not isinstance(data, Mapping) or not dataclasses.is_dataclass(cls):
        return None
    hints = typing.get_type_hints(cls)
    for name, value in data.items():
        key, hint = f"{prefix}{name}", hints.get(str(name))
        if hint is None:
            continue
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, Mapping):
                return key, value, "a section (a mapping of keys)"
            inner = _mistyped(value, hint, f"{key}.")
            if inner:
                return inner
        elif typing.get_origin(hint) is list and isinstance(value, Mapping):
            return key, value, "a list"
    return None


def _shape(want: str, key: str) -> str:
    if want == "a list":
        return f"a YAML list under {key}: (lines starting with '- ')"
    leaf = key.rsplit(".", 1)[-1]
    return f"indented key: value lines under {leaf}: (e.g. {key}.NAME=VALUE on the command line)"


def _similar_key(key: str, root: type) -> str | None:
    """The existing key closest to the misspelt ``key`` (``train.lrr`` → ``train.lr``), or
    None: the last part is matched against the fields of the section the rest names."""
    *path, last = key.split(".")
    cls: Any = root
    for part in path:
        hints = typing.get_type_hints(cls) if dataclasses.is_dataclass(cls) else {}
        cls = hints.get(re.sub(r"\[\d+\]$", "", part))
        while typing.get_origin(cls) is list:
            (cls,) = typing.get_args(cls)
    if not dataclasses.is_dataclass(cls):
        return None
    names = [f.name for f in dataclasses.fields(cls)]
    match = difflib.get_close_matches(last, names, n=1, cutoff=0.6)
    return ".".join([*path, match[0]]) if match else None


def _raw_value(cfg: Any, key: str) -> Any:
    """The unresolved value at dotted ``key`` (``data.sources[0].path``) of a config (an
    OmegaConf container or plain data), or None where there is none."""
    node: Any = _plain(cfg)
    for part in re.findall(r"[^.\[\]]+", key):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
