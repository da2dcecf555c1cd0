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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import DataConfig, SourceConfig
from .tokenizer_id import KIND_GGUF, tokenizer_source_fingerprint

# Version of the on-disk layout and of the packing algorithm: bump when the bytes change.
FORMAT_VERSION = 1
LAYOUT = "document_causal_lm"  # metadata.json's layout: whole documents, causal LM targets
# The layout of a labelled pack: targets are the labels in labels.bin, aligned with the inputs
# (not the next token). A distinct name, so that code reading only LAYOUT refuses such a pack
# rather than training it as a causal LM.
LAYOUT_LABELLED = "document_labelled"
# Version of the reasoning generators (pipeline_lib.data.reasoning): bump when output changes.
REASONING_GENERATOR_VERSION = 1
# Version of the labelled generators (pipeline_lib.data.labelled_tasks): bump when output changes.
LABELLED_GENERATOR_VERSION = 1
# Version of the answer spans (answer_spans.npy): 1 = the answer's tokens; 2 = the answer's
# tokens and the EOS after them (answer objectives learn to stop). In data_id only for packs
# that can have answers, so packs of plain text keep their id.
ANSWER_SPAN_VERSION = 2
FILE_SOURCE_TYPES = ("parquet", "jsonl", "text")


@dataclass(frozen=True)
class SourceGlob:
    """What a file source's glob matched: ``files`` (sorted, each file once), the symlinked
    directories not followed because they lead back into their own parents (``loops``), and
    the paths skipped because they name a file matched by another path too (``duplicates``:
    (skipped, kept), e.g. a file reached through a symlink as well as directly)."""

    files: list[Path]
    loops: list[str]
    duplicates: list[tuple[Path, Path]]


def is_file_source(src: SourceConfig) -> bool:
    """Whether a source reads the files of its ``path`` glob (a labelled source does when it
    has a path, else it generates its built-in tasks)."""
    return src.type in FILE_SOURCE_TYPES or (src.type == "labelled" and bool(src.path))


def source_files(src: SourceConfig) -> list[Path]:
    """Files matched by a file source's glob (``**`` recursive), sorted; [] for built-ins.
    Symlink loops are not followed and a file is listed once (see :func:`glob_source`)."""
    return glob_source(src).files


def glob_source(src: SourceConfig) -> SourceGlob:
    """A file source's glob expanded like :func:`glob.glob` (``**`` recursive, hidden names
    skipped by ``**``), except that ``**`` never enters a symlinked directory that leads back
    into one of its own parents, and a file matched by several paths is kept once, under the
    path that goes through no symlink if there is one, else the first in sorted order.
    Without symlinks the result is :func:`glob.glob`'s."""
    if not is_file_source(src) or not src.path:
        return SourceGlob([], [], [])
    loops: list[str] = []
    matched = sorted(Path(p) for p in _expand(os.path.expanduser(src.path), loops)
                     if os.path.isfile(p))
    paths: dict[Path, list[Path]] = {}
    for path in dict.fromkeys(matched):  # the same path twice (two ``**``) is no news
        paths.setdefault(path.resolve(), []).append(path)
    kept = {real: min(group, key=lambda p: (Path(os.path.abspath(p)) != real, p))
            for real, group in paths.items()}  # the path without a symlink, if one is
    files = sorted(kept.values())
    duplicates = sorted((p, kept[real]) for real, group in paths.items() for p in group
                        if p != kept[real])
    return SourceGlob(files, list(dict.fromkeys(loops)), duplicates)


def _expand(pattern: str, loops: list[str]) -> list[str]:
    """:func:`glob.glob` of ``pattern`` with each ``**`` component expanded by
    :func:`_walk_dirs` (which records the loops it does not follow in ``loops``)."""
    parts = pattern.split(os.sep)
    if "**" not in parts:
        return glob.glob(pattern)
    i = parts.index("**")
    rest = os.sep.join(parts[i + 1:])
    prefix = os.sep.join(parts[:i]) or (os.sep if i else "")
    bases = glob.glob(prefix) if glob.has_magic(prefix) else [prefix]
    out: list[str] = []
    for base in bases:
        if base and not os.path.isdir(base):
            continue
        for directory in _walk_dirs(base, loops):
            if rest:
                out += _expand(os.path.join(glob.escape(directory), rest), loops)
            else:  # a trailing ``**`` matches every (non-hidden) name below the base
                out += [os.path.join(directory, name) for name in sorted(os.listdir(directory))
                        if not name.startswith(".")]
    return out


def _walk_dirs(base: str, loops: list[str]) -> Iterator[str]:
    """``base`` and every non-hidden directory below it (what ``**`` matches), following
    symlinked directories except those that lead back to a directory on their own path."""
    top = base or os.curdir
    try:
        st = os.stat(top)
    except OSError:
        return
    ancestors = {top: frozenset([(st.st_dev, st.st_ino)])}
    for dirpath, dirnames, _ in os.walk(top, followlinks=True):
        yield dirpath if base else os.path.relpath(dirpath)
        keep = []
        for name in sorted(dirnames):
            if name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.stat(full)
            except OSError:  # vanished or unreadable: glob skips it too
                continue
            key = (st.st_dev, st.st_ino)
            if key in ancestors[dirpath]:
                loops.append(full if base else os.path.relpath(full))
                continue
            ancestors[full] = ancestors[dirpath] | {key}
            keep.append(name)
        dirnames[:] = keep


def stdlib_dir() -> Path:
    """Directory of the running Python's standard library (the ``stdlib`` source)."""
    return Path(sysconfig.get_paths()["stdlib"])


def source_fingerprint(src: SourceConfig) -> dict[str, Any]:
    """What determines a source's documents, cheaply: settings plus file stats or versions."""
    fp: dict[str, Any] = {"type": src.type, "weight": src.weight, "max_docs": src.max_docs}
    if src.heldout:  # only when set, so that packs made before the key existed keep their id
        fp["heldout"] = True
    if is_file_source(src):
        files = []
        for path in source_files(src):
            st = path.stat()
            files.append([str(path.resolve()), st.st_size, st.st_mtime_ns])
        fp.update(path=src.path, files=files)
        if src.type in ("jsonl", "parquet"):
            fp["text_field"] = src.text_field
            # Only when set, so that packs made before these keys existed keep their id.
            fp.update({key: getattr(src, key) for key in ("prompt_field", "answer_field",
                                                           "level_field") if getattr(src, key)})
    elif src.type == "stdlib":
        fp.update(python=sys.version, stdlib=str(stdlib_dir()))
    elif src.type in ("reasoning", "labelled"):
        fp.update(
            generator_version=(REASONING_GENERATOR_VERSION if src.type == "reasoning"
                               else LABELLED_GENERATOR_VERSION),
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
    # lazy: importlib.metadata costs ~50 ms, and byte-level packs (the default) never need it
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
    if any(has_answers(s) for s in data.sources):
        fp["answer_spans"] = ANSWER_SPAN_VERSION
    return fp


def has_answers(src: SourceConfig) -> bool:
    """Whether a source's documents carry answer spans (reasoning, prompt/answer records)."""
    return src.type == "reasoning" or (src.type in ("jsonl", "parquet") and bool(src.answer_field))


def data_id(data: DataConfig) -> str:
    """12 hex characters naming ``results/data/{data_id}``; same inputs → same id."""
    return fingerprint_hash(data_fingerprint(data), 12)
