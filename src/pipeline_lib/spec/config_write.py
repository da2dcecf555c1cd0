"""The config written out: plain data, YAML, a stable hash, flat keys (MLflow params); the
credentials of ``tracking.uri`` leave through none of them but :func:`to_dict`."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..credentials import redact_config
from .config import Config
from .config_errors import omegaconf


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config (or one section) as plain, JSON-able data."""
    return dataclasses.asdict(cfg)


def public_dict(cfg: Any) -> dict[str, Any]:
    """:func:`to_dict` with the credentials of ``tracking.uri`` removed: what may be written
    to a file, a log or MLflow (see :mod:`pipeline_lib.credentials`)."""
    return redact_config(to_dict(cfg))


def config_hash(cfg: Any, length: int = 12) -> str:
    """Short stable hash of a config (or section): sorted-key JSON, sha256."""
    data = to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg
    if isinstance(data, Mapping):
        data = redact_config(data)  # credentials are not config: changing them changes nothing
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def config_yaml(cfg: Config) -> str:
    """The resolved config as YAML text (plain data, loadable by :func:`~.config_load.load_config`; what a
    snapshot's ``config.yaml`` holds); ``tracking.uri`` without credentials."""
    OmegaConf = omegaconf().OmegaConf
    return OmegaConf.to_yaml(OmegaConf.create(public_dict(cfg)))


def save_config(cfg: Config, path: Path) -> None:
    """Write the resolved config as YAML (see :func:`config_yaml`)."""
    path.write_text(config_yaml(cfg))


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping → {"a.b.c": value}; lists are kept as values."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out

