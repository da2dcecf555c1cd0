"""Lazy package exports (PEP 562): ``from pipeline_lib.model import LoopedLM`` imports torch
only when the name is used, so torch-free submodules stay cheap for the Snakefile."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` resolving ``name`` from submodule ``exports[name]``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module.lstrip('.')}", package), name)

    return __getattr__
