"""Where a file tokenizer (``data.tokenizer.type: file``) lives, and its identity.

By the path's shape and the files' stats alone, nothing read: the data id
(:mod:`.data_id`) fingerprints a file tokenizer on every Snakemake call, and a GGUF is
hundreds of MB. Reading the files is :mod:`pipeline_lib.data.tokenizer_files`'.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .names import TOKENIZER_FILE

HF_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "config.json")
KIND_JSON, KIND_HF_DIR, KIND_GGUF = "tokenizer.json", "hf_directory", "gguf"


def tokenizer_path(path: str) -> Path:
    """``data.tokenizer.path`` as a path (``~`` expanded; relative to the working directory)."""
    return Path(os.path.expanduser(path))


def source_kind(path: Path) -> str:
    """:data:`KIND_HF_DIR` for a directory, :data:`KIND_GGUF` for ``*.gguf``, else
    :data:`KIND_JSON` (by the path's shape; nothing is read)."""
    if path.is_dir():
        return KIND_HF_DIR
    return KIND_GGUF if path.suffix.lower() == ".gguf" else KIND_JSON


def tokenizer_source_files(path: Path) -> list[Path]:
    """The existing files the tokenizer is built from ([] when there are none)."""
    if source_kind(path) == KIND_HF_DIR:
        return [path / n for n in (TOKENIZER_FILE, *HF_SIDE_FILES) if (path / n).is_file()]
    return [path] if path.is_file() else []


def tokenizer_source_fingerprint(path: str) -> dict[str, Any]:
    """Identity of a file tokenizer for the data id: each file's (path, size, mtime_ns), as
    for file sources (never its content: a GGUF is hundreds of MB). Never raises; a missing
    source fingerprints as no files, and the pack reports it."""
    p = tokenizer_path(path)
    files = []
    for f in tokenizer_source_files(p):
        st = f.stat()
        files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
    return {"kind": source_kind(p), "path": path, "files": files}
