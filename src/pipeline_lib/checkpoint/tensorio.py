"""Tensors in safetensors files, everything else in tagged JSON: no pickle anywhere.

- :func:`write_safetensors` streams tensors into a standard safetensors file while hashing
  it (no second read for the manifest), records the caller's key order, and stores tensors that share storage once: a key
  that is the same tensor as another (tied embeddings) is recorded as an alias in the
  file's metadata and restored as the same tensor by :func:`read_safetensors`.
- :func:`split_tree` / :func:`join_tree` turn a nested structure such as
  ``optimizer.state_dict()`` into (JSON document, {name: tensor}) and back exactly:
  int dict keys, tuples and tensors survive the round trip; :func:`read_tree` reads such a
  pair of files back.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ..errors import CheckpointError
from .manifest import HashingWriter

ALIASES_KEY = "loopline.aliases"
ORDER_KEY = "loopline.order"
TENSOR_TAG = "__tensor__"
TUPLE_TAG = "__tuple__"
ITEMS_TAG = "__items__"
_TAGS = frozenset({TENSOR_TAG, TUPLE_TAG, ITEMS_TAG})

_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32",
    torch.uint64: "U64", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}

assert sys.byteorder == "little", "safetensors stores little-endian data"


def _view_key(t: torch.Tensor) -> tuple:
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            t.stride(), t.dtype)


def _plan(tensors: Mapping[str, torch.Tensor], where: str
          ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Unique tensors to store and {alias: stored name} for exact duplicates."""
    stored: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    by_view: dict[tuple, str] = {}
    storages: set[tuple] = set()
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise CheckpointError(f"{where}: value of '{name}' is a {type(t).__name__}, not a "
                                  "tensor; pass tensors only (scalars go into the JSON state)")
        if t.dtype not in _DTYPES or t.layout != torch.strided or t.is_quantized:
            raise CheckpointError(f"{where}: tensor '{name}' has dtype {t.dtype}/layout "
                                  f"{t.layout}, which safetensors cannot store; convert it first")
        t = t.detach()
        key = _view_key(t)
        if key in by_view:
            aliases[name] = by_view[key]
            continue
        storage = (t.device, t.untyped_storage().data_ptr())
        if t.numel() and storage in storages:
            t = t.clone()  # overlaps another stored tensor in a different view: store a copy
        storages.add(storage)
        by_view[key] = name
        stored[name] = t
    return stored, aliases


def write_safetensors(path: Path, tensors: Mapping[str, torch.Tensor], *, role: str,
                      metadata: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Write ``tensors`` as a safetensors file at ``path`` (fsynced); return its manifest record.

    Tensors on an accelerator are copied to host memory one at a time.
    """
    stored, aliases = _plan(tensors, str(path))
    meta = dict(metadata or {})
    if aliases:
        meta[ALIASES_KEY] = json.dumps(aliases, sort_keys=True)
    meta[ORDER_KEY] = json.dumps(list(tensors))  # safetensors sorts names; keep the caller's
    header: dict[str, Any] = {}
    offset = 0
    for name, t in stored.items():
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if meta:
        header["__metadata__"] = meta
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format pads the header to 8-byte alignment
    with open(path, "wb") as fh:
        writer = HashingWriter(fh)
        writer.write(len(blob).to_bytes(8, "little"))
        writer.write(blob)
        for t in stored.values():
            if t.numel() == 0:
                continue
            host = t.to("cpu").contiguous().reshape(-1).view(torch.uint8)
            writer.write(host.numpy().data)
        fh.flush()
        os.fsync(fh.fileno())
    return writer.record(role)


def read_safetensors(path: Path, *, device: str | torch.device = "cpu"
                     ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors (aliases restored as the same tensor) and user metadata of a safetensors file."""
    out: dict[str, torch.Tensor] = {}
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            meta = dict(f.metadata() or {})
            for name in f.keys():
                out[name] = f.get_tensor(name)
    except (OSError, RuntimeError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc}); the snapshot "
                              "is corrupted, rerun the segment that writes it") from None
    aliases = json.loads(meta.pop(ALIASES_KEY, "{}"))
    for alias, target in aliases.items():
        out[alias] = out[target]
    order = json.loads(meta.pop(ORDER_KEY, "[]"))
    if sorted(order) != sorted(out):
        order = sorted(out)
    return {name: out[name] for name in order}, meta


# --------------------------------------------------------------------------- tagged JSON


def split_tree(obj: Any, where: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """Nested dict/list/tuple/scalars/tensors → (JSON-able document, {name: tensor}).

    Tensors become ``{"__tensor__": name}`` (name = their path, "/"-joined), tuples
    ``{"__tuple__": [...]}``, dicts with non-str (or tag-like) keys ``{"__items__": [[k, v]]}``.
    Anything else that JSON cannot hold raises CheckpointError naming the path.
    """
    tensors: dict[str, torch.Tensor] = {}

    def enc(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            name = path.lstrip("/") or "value"
            while name in tensors:  # keys 0 and "0" of one dict share a path
                name += "'"
            tensors[name] = value
            return {TENSOR_TAG: name}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, tuple):
            return {TUPLE_TAG: [enc(v, f"{path}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [enc(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            keys = list(value)
            if all(isinstance(k, str) for k in keys) and not (_TAGS & set(keys)):
                return {k: enc(value[k], f"{path}/{k}") for k in keys}
            items = []
            for k in keys:
                if k is not None and not isinstance(k, (bool, int, float, str, tuple)):
                    raise CheckpointError(f"{where}: key {k!r} at '{path or '/'}' is a "
                                          f"{type(k).__name__}; use str or int keys")
                items.append([enc(k, f"{path}/key"), enc(value[k], f"{path}/{k}")])
            return {ITEMS_TAG: items}
        raise CheckpointError(f"{where}: value at '{path or '/'}' is a {type(value).__name__}, "
                              "which a snapshot cannot hold; convert it to a tensor or to "
                              "JSON-able data")

    return enc(obj, ""), tensors


def join_tree(doc: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    """Inverse of :func:`split_tree`."""

    def dec(value: Any) -> Any:
        if isinstance(value, list):
            return [dec(v) for v in value]
        if isinstance(value, dict):
            if len(value) == 1:
                (tag, inner), = value.items()
                if tag == TENSOR_TAG:
                    if inner not in tensors:
                        raise CheckpointError(f"{where}: tensor '{inner}' is referenced but "
                                              "missing; the snapshot is corrupted")
                    return tensors[inner]
                if tag == TUPLE_TAG:
                    return tuple(dec(v) for v in inner)
                if tag == ITEMS_TAG:
                    return {_hashable(dec(k)): dec(v) for k, v in inner}
            return {k: dec(v) for k, v in value.items()}
        return value

    return dec(doc)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def read_json(path: Path) -> Any:
    """A snapshot's JSON file; CheckpointError when it is not readable JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not readable JSON ({exc}); the snapshot is corrupted, "
                              "rerun the segment that writes it") from None


def read_tree(directory: Path, doc_name: str, tensors_name: str | None = None) -> Any:
    """What :func:`split_tree` wrote as ``doc_name`` (JSON) + ``tensors_name`` (safetensors;
    None: the document references no tensors) in ``directory``, joined back."""
    tensors = {} if tensors_name is None else read_safetensors(directory / tensors_name)[0]
    return join_tree(read_json(directory / doc_name), tensors, str(directory / doc_name))


def dumps_json(doc: Any) -> bytes:
    """Deterministic JSON bytes (NaN/Infinity allowed: Python reads them back exactly)."""
    return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()
