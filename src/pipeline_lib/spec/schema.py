"""JSON Schema (draft 2020-12) of the config, generated from the dataclasses.

The committed ``workflow/schemas/config.schema.yaml`` is this function's output; a test
regenerates it and compares, so schema and dataclasses always describe the same keys,
types, defaults and constraints. Regenerate with ``python -m pipeline_lib schema --write``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .config import Config
from .config_load import PROJECT_ROOT
from .names import RUN_NAME_PATTERN

SCHEMA_PATH = PROJECT_ROOT / "workflow" / "schemas" / "config.schema.yaml"
_SCALARS = {bool: "boolean", int: "integer", float: "number", str: "string"}


def _type_schema(tp: Any, default: Any = None) -> dict[str, Any]:
    """``default``: the field's default when it is a section (its defaults may differ from
    the section class's own, as ``eval.adaptive``'s do from ``bench.adaptive``'s)."""
    if dataclasses.is_dataclass(tp):
        return _object_schema(tp, default)
    origin = typing.get_origin(tp)
    if origin is list:
        (item,) = typing.get_args(tp)
        return {"type": "array", "items": _type_schema(item)}
    if origin is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a) for a in typing.get_args(tp)]}
    if tp is type(None):
        return {"type": "null"}
    if tp is float:  # YAML writes 1 for 1.0: accept integers where a number is expected
        return {"type": "number"}
    return {"type": _SCALARS[tp]}


def _constraints(meta: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if meta.get("choices") is not None:
        out["enum"] = list(meta["choices"])
    for key, name in (("minimum", "minimum"), ("exclusive_minimum", "exclusiveMinimum"),
                      ("maximum", "maximum"), ("min_items", "minItems")):
        if meta.get(key) is not None:
            out[name] = meta[key]
    return out


def _object_schema(cls: type, instance: Any = None) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    instance = cls() if instance is None else instance
    props: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        default = getattr(instance, f.name)
        prop = _type_schema(hints[f.name], default if dataclasses.is_dataclass(default) else None)
        prop.update(_constraints(f.metadata))
        if "items" in f.metadata and "items" in prop:
            prop["items"].update(_constraints(f.metadata["items"]))
        prop["description"] = f.metadata["help"]
        if not dataclasses.is_dataclass(default):
            prop["default"] = _plain(default)
        props[f.name] = prop
    return {
        "type": "object",
        "description": (cls.__doc__ or "").strip().splitlines()[0],
        "additionalProperties": False,
        "properties": props,
    }


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def build_schema() -> dict[str, Any]:
    """The full config schema; ``runs`` entries are validated as partial configs."""
    root = _object_schema(Config)
    variant = {k: {"$ref": f"#/properties/{k}"} for k in root["properties"] if k != "runs"}
    root["properties"]["runs"].update({
        "patternProperties": {
            RUN_NAME_PATTERN: {
                "type": ["object", "null"],
                "description": "A variant: any subset of the sections above, merged over them.",
                "additionalProperties": False,
                "properties": variant,
            }
        },
        "additionalProperties": False,
    })
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "loopline config", **root}


def schema_yaml() -> str:
    header = ("# Generated from src/pipeline_lib/spec/config.py by "
              "`python -m pipeline_lib schema --write`; do not edit by hand.\n")
    return header + yaml.safe_dump(build_schema(), sort_keys=False, allow_unicode=True, width=100)


def write_schema(path: Path = SCHEMA_PATH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(schema_yaml())
    return path
