"""A config field: its default, help text and bounds, declared once and checked generically.

:func:`config_field` stores the help text and the constraints (``choices``, ``minimum``,
``exclusive_minimum``, ``maximum``, ``min_items``, ``items``) in the dataclass field's
metadata; the JSON schema (:mod:`pipeline_lib.spec.schema`) and
:func:`check_field_constraints` both read them there, so the schema and the loader's checks
cannot disagree. Cross-field rules live
in :mod:`pipeline_lib.spec.rules` (``validate_config``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from ..errors import ConfigError


def config_field(default: Any, help: str, **schema: Any) -> Any:
    """A dataclass field with a help text and optional schema constraints.

    ``schema`` may hold ``choices`` (allowed values), ``minimum``, ``exclusive_minimum``,
    ``maximum``, ``min_items`` (shortest list allowed) and ``items`` (constraints for list
    items); they feed both the generated JSON schema and :func:`check_field_constraints`.
    """
    meta = {"help": help, **schema}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


def check_field_constraints(obj: Any, prefix: str) -> None:
    """Every field of the dataclass ``obj`` (recursively, list items included) against its
    declared constraints; ConfigError naming the key ``{prefix}{field}`` and the fix."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_field_constraints(value, f"{key}.")
            continue
        if isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
            for i, item in enumerate(value):
                check_field_constraints(item, f"{key}[{i}].")
            continue
        _check_length(key, value, f)
        _check_value(key, value, f.metadata)
        if isinstance(value, list) and "items" in f.metadata:
            for i, item in enumerate(value):
                _check_value(f"{key}[{i}]", item, f.metadata["items"])


def _check_length(key: str, value: Any, f: dataclasses.Field) -> None:
    min_items = f.metadata.get("min_items")
    if min_items is not None and isinstance(value, list) and len(value) < min_items:
        default = f.default_factory() if callable(f.default_factory) else None
        raise ConfigError(f"config key {key} = {value} needs at least {min_items} item(s); "
                          f"list them, e.g. the default {default}")


def _check_value(key: str, value: Any, meta: Mapping[str, Any]) -> None:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"config key {key} = {value!r} is not allowed; use one of {choices}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        lo, lo_x, hi = meta.get("minimum"), meta.get("exclusive_minimum"), meta.get("maximum")
        if lo is not None and value < lo:
            raise ConfigError(f"config key {key} = {value} is below its minimum {lo}; raise it")
        if lo_x is not None and value <= lo_x:
            raise ConfigError(f"config key {key} = {value} must be greater than {lo_x}")
        if hi is not None and value > hi:
            raise ConfigError(f"config key {key} = {value} is above its maximum {hi}; lower it")
