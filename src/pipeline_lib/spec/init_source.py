"""The identity of a pretrained source (``model.init_from.source``): cheap, header-free.

A source is identified by its resolved path and the size and mtime of the files its import
reads, never by a content hash: the Snakefile's plan computes this on every call (the train
and import signatures carry :func:`fingerprint_id`), so it must not read gigabytes.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def source_files(source: str | Path) -> list[Path]:
    """The files a source's import reads: the GGUF itself, or a directory's JSON and
    safetensors files (under the path as given)."""
    source = Path(source).expanduser()
    return [source] if source.is_file() else sorted(
        p for p in source.iterdir() if p.suffix in (".json", ".safetensors", ".gguf"))


def source_fingerprint(source: str | Path) -> dict[str, Any]:
    """What identifies a source cheaply: resolved path, size and mtime of its weight and
    config files (no content hash: the Snakefile computes this on every call)."""
    source, files = Path(source).expanduser().resolve(), source_files(source)
    return {"source": str(source),
            "files": [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]}


def fingerprint_id(source: str | Path) -> str:
    """A 12-hex-digit hash of :func:`source_fingerprint` (what the signatures record)."""
    blob = json.dumps(source_fingerprint(source), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
