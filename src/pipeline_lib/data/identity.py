"""Identity of a data pack: ``data_id`` = short hash of everything that determines its bytes.

Evaluated by the Snakefile on every call (including dry runs), so it must stay cheap and
import nothing heavy: file sources are fingerprinted by (path, size, mtime_ns) of the files
their glob matches, never by their content; built-ins by what generates them; a file
tokenizer (``data.tokenizer.type: file``) like a file source, by the files it is read from.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path
from typing import Any

from ..config import DataConfig, SourceConfig
from .tokenizer_files import KIND_GGUF, tokenizer_source_fingerprint

# Version of the on-disk layout and of the packing algorithm: bump when the bytes change.
FORMAT_VERSION = 1
# Version of the reasoning generators (pipeline_lib.data.reasoning): bump when output changes.
REASONING_GENERATOR_VERSION = 1
FILE_SOURCE_TYPES = ("parquet", "jsonl", "text")


def source_files(src: SourceConfig) -> list[Path]:
    """Files matched by a file source's glob (``**`` recursive), sorted; [] for built-ins."""
    if src.type not in FILE_SOURCE_TYPES or not src.path:
        return []
    pattern = os.path.expanduser(src.path)
    return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def stdlib_dir() -> Path:
    """Directory of the running Python's standard library (the ``stdlib`` source)."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_fingerprint(src: SourceConfig) -> dict[str, Any]:
    """What determines a source's documents, cheaply: settings plus file stats or versions."""
    fp: dict[str, Any] = {"type": src.type, "weight": src.weight, "max_docs": src.max_docs}
    if src.type in FILE_SOURCE_TYPES:
        files = []
        for path in source_files(src):
            st = path.stat()
            files.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
        fp.update(path=src.path, files=files)
        if src.type != "text":
            fp["text_field"] = src.text_field
            # Only when set, so that packs made before these keys existed keep their id.
            fp.update({key: getattr(src, key) for key in ("prompt_field", "answer_field",
                                                           "level_field") if getattr(src, key)})
    elif src.type == "stdlib":
        fp.update(python=sys.version, stdlib=str(stdlib_dir()))
    elif src.type == "reasoning":
        fp.update(
            generator_version=REASONING_GENERATOR_VERSION,
            num_docs=src.num_docs,
            tasks=list(src.tasks),
            min_difficulty=src.min_difficulty,
            max_difficulty=src.max_difficulty,
            seed=src.seed,
        )
    return fp


def fingerprint_hash(fingerprint: Any, length: int = 64) -> str:
    """sha256 (hex, truncated to ``length``) of sorted-key JSON."""
    blob = json.dumps(fingerprint, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def _tokenizer_fingerprint(data: DataConfig) -> dict[str, Any]:
    tok = data.tokenizer
    if tok.type == "byte":  # BPE knobs do not change a byte-level pack
        return {"type": "byte"}
    from importlib.metadata import PackageNotFoundError, version

    # A trained BPE may change with the tokenizers release that trains it, and so may the
    # encoding of a file tokenizer (and a GGUF's with the transformers that rebuilds it).
    if tok.type == "bpe":  # the keys of packs made before file tokenizers existed
        return {"type": "bpe", "vocab_size": tok.vocab_size, "min_frequency": tok.min_frequency,
                "tokenizers": version("tokenizers")}
    fp = {"type": "file", "add_bos": tok.add_bos, "source": tokenizer_source_fingerprint(tok.path),
          "tokenizers": version("tokenizers")}
    if fp["source"]["kind"] == KIND_GGUF:
        try:
            fp["transformers"] = version("transformers")
        except PackageNotFoundError:  # the pack says how to install it
            fp["transformers"] = None
    return fp


def data_fingerprint(data: DataConfig) -> dict[str, Any]:
    """Everything that determines the packed bytes, as plain JSON-able data."""
    fp = {
        "format": FORMAT_VERSION,
        "sources": [source_fingerprint(s) for s in data.sources],
        "tokenizer": _tokenizer_fingerprint(data),
        "seq_len": data.seq_len,
        "epochs": data.epochs,
        "val_fraction": data.val_fraction,
        "seed": data.seed,
        "token_dtype": data.token_dtype,
    }
    if data.curriculum_fraction > 0:  # only when on: packs without a curriculum keep their id
        fp["curriculum_fraction"] = data.curriculum_fraction
    return fp


def data_id(data: DataConfig) -> str:
    """12 hex characters naming ``results/data/{data_id}``; same inputs → same id."""
    return fingerprint_hash(data_fingerprint(data), 12)
