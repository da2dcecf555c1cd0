"""The data stage: corpus → tokenizer → ``tokens.bin`` → packed epoch shards + metadata.

Layout of the output directory (see DESIGN.md, "Data formats")::

    tokenizer.json  metadata.json  tokens.bin  docs.npy  answer_spans.npy  levels.npy
    labels.bin (labelled packs only)
    train/epoch_{e}/{doc_start,doc_len,row_ptr}.npy    val/{doc_start,doc_len,row_ptr}.npy

``levels.npy`` holds each document's level (int64, -1 = unknown). With
``data.curriculum_fraction`` > 0 the training rows of every epoch are packed level by level
(each row holds documents of one level) and epoch 0's rows are ordered so that the largest
level allowed rises over that fraction of the epoch (:func:`.packing.curriculum_order`);
later epochs keep a seeded random row order.

A labelled pack (``labelled`` sources, :mod:`.labelled`; layout ``document_labelled``, so that
a reader of causal-LM packs refuses it) also writes ``labels.bin``: int32, one per token of
``tokens.bin``, the label of that token (scored at that token, not shifted) or -100
(``IGNORE_INDEX``) where it has none. In every pack, each document of a ``heldout`` source
goes to ``val/`` and ``data.val_fraction`` splits the others (:mod:`.doc_split`);
``metadata.json`` records ``labelled``, ``label_dtype`` (null when not), ``heldout_docs`` and
``train_levels`` (the distinct levels >= 0 of the training documents).

``tokenizer.json`` is loopline's byte or BPE tokenizer, or a pretrained one
(``data.tokenizer.type: file``, :mod:`.tokenizer_source`) with its vocabulary unchanged;
``metadata.json`` records ``eos_id``, ``pad_id``, ``bos_id`` (the token every document
starts with, or null) and, for a file tokenizer, its source (``tokenizer_source``).

Everything is written into a hidden temporary sibling and renamed into place at the end,
so a failed or interrupted pack leaves nothing that looks complete. Documents are streamed
(:mod:`.token_stream`: tokenized in batches and appended to ``tokens.bin``); only
per-document lengths stay in memory. The same config gives byte-identical files: every
random choice comes from ``numpy.random.default_rng([data.seed, stream, …])``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError, DataError
from ..fsio import file_sha256, is_write_failure
from ..output_paths import check_output_dir
from ..spec.config import DataConfig
from ..spec.data_id import (
    ANSWER_SPAN_VERSION,
    FORMAT_VERSION,
    LAYOUT,
    LAYOUT_LABELLED,
    data_id,
    fingerprint_hash,
    glob_source,
    source_fingerprint,
)
from ..spec.names import PACK_LABELS, PACK_METADATA, PACK_TOKENS
from ..spec.rules import check_labelled_sources
from .doc_split import repeat_by_weight, validation_split
from .labelled import LabelRules
from .labelled_tasks import check_task_levels
from .packing import PackedRows, fill_ratio, pack_documents, pack_documents_by_level
from .sources import MAX_NAMED_FILES, SourceStats, check_source
from .token_stream import (
    LABEL_DTYPE,
    TokenizedCorpus,
    all_documents,
    tokenize_corpus,
    tokenize_labelled,
)
from .tokenizer import TokenEncoder, build_tokenizer, eos_id, pad_id
from .tokenizer_files import check_tokenizer_source, source_vocab_size
from .tokenizer_source import TokenizerInfo, tokenizer_from_source
from .verify import SELF_HASH_KEY, metadata_digest

log = logging.getLogger(__name__)

_DTYPE_MAX_IDS = {"uint16": 1 << 16, "uint32": 1 << 32}
# Stream ids of the seeded generators (default_rng([seed, stream, …])); 1 and 2: doc_split's.
_EPOCH, _VAL = 3, 4


def _check_config(data: DataConfig) -> None:
    if data.seq_len < 2:
        raise ConfigError(f"config key data.seq_len = {data.seq_len} is below 2; rows need at "
                          "least one input and one target, raise it")
    if data.tokenizer.type == "file":
        check_tokenizer_source(data.tokenizer.path)
    check_labelled_sources(data.sources, data.tokenizer)
    for index, src in enumerate(data.sources):
        if src.type == "labelled" and not src.path:
            check_task_levels(index, src)
    if data.token_dtype != "auto":
        limit = _DTYPE_MAX_IDS[data.token_dtype]
        if data.tokenizer.type == "bpe" and data.tokenizer.vocab_size > limit:
            raise ConfigError(
                f"config key data.tokenizer.vocab_size = {data.tokenizer.vocab_size} does not "
                f"fit data.token_dtype = {data.token_dtype} (at most {limit} ids); set "
                "data.token_dtype to auto or uint32, or lower the vocabulary size")
        if data.tokenizer.type == "file":
            _token_dtype(data, source_vocab_size(data.tokenizer.path))


def _token_dtype(data: DataConfig, vocab_size: int) -> np.dtype:
    name = data.token_dtype
    if name == "auto":
        name = "uint16" if vocab_size <= _DTYPE_MAX_IDS["uint16"] else "uint32"
    if vocab_size > _DTYPE_MAX_IDS[name]:
        raise ConfigError(f"the tokenizer has {vocab_size} ids, more than data.token_dtype = "
                          f"{name} can hold; set data.token_dtype to auto or uint32")
    return np.dtype(name)


def _save(tmp: Path, rel: str, array: np.ndarray, hashes: dict[str, str]) -> None:
    path = tmp / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.ascontiguousarray(array))
    hashes[rel] = file_sha256(path)


def _save_rows(tmp: Path, prefix: str, packed: PackedRows, hashes: dict[str, str]) -> None:
    _save(tmp, f"{prefix}/doc_start.npy", packed.piece_start, hashes)
    _save(tmp, f"{prefix}/doc_len.npy", packed.piece_len, hashes)
    _save(tmp, f"{prefix}/row_ptr.npy", packed.row_ptr, hashes)


def _source_report(data: DataConfig, stats: list[SourceStats], tok: TokenizedCorpus) -> list[dict]:
    tokens = np.bincount(tok.doc_source, weights=tok.doc_len, minlength=len(data.sources))
    out = []
    for i, (src, st) in enumerate(zip(data.sources, stats, strict=True)):
        found = glob_source(src)
        out.append({
            "index": i, "type": src.type, "path": src.path, "weight": src.weight,
            "heldout": src.heldout,
            "num_files": len(found.files),
            # what the glob did not read: symlinks that loop, paths of a file already read
            "symlink_loops": found.loops[:MAX_NAMED_FILES],
            "duplicate_paths": len(found.duplicates),
            "fingerprint": fingerprint_hash(source_fingerprint(src)),
            "num_tokens": int(tokens[i]), **asdict(st),
        })
    return out


def _curriculum_report(fraction: float, row_level: np.ndarray) -> dict[str, Any]:
    """What metadata.json records of epoch 0's curriculum: the ramp and the row at which
    each level first appears (its release, or earlier when lower levels ran out)."""
    known = np.unique(row_level[row_level >= 0]).tolist()
    if len(known) < 2:
        log.warning("data.curriculum_fraction = %s but the training rows have %d known "
                    "level(s); nothing to order, rows stay in a random order",
                    fraction, len(known))
    return {
        "fraction": fraction,
        "ramp_rows": math.ceil(fraction * len(row_level)),
        "first_row_of_level": {str(lv): int(np.argmax(row_level == lv)) for lv in known},
    }


def _build_tokenizer(data: DataConfig) -> tuple[Any, TokenizerInfo | None]:
    """The pack's tokenizer and, for a file tokenizer, what its source says; a BPE one is
    trained by a first streaming pass over the corpus."""
    if data.tokenizer.type == "file":
        return tokenizer_from_source(data.tokenizer.path, data.tokenizer.add_bos)
    if data.tokenizer.type != "bpe":
        return build_tokenizer(data.tokenizer, ()), None
    train_stats = [SourceStats() for _ in data.sources]
    texts = (d.text + d.answer for _, d in all_documents(data, train_stats))
    return build_tokenizer(data.tokenizer, tqdm(texts, desc="training BPE", unit="doc",
                                                disable=None)), None


def _write_documents(data: DataConfig, tmp: Path, tokenizer: Any, tok_meta: dict[str, Any],
                     dtype: np.dtype, hashes: dict[str, str]
                     ) -> tuple[TokenizedCorpus, list[SourceStats], np.ndarray]:
    """``tokens.bin``, ``docs.npy``, ``answer_spans.npy``, ``levels.npy`` and, in a labelled
    pack, ``labels.bin`` (hashes recorded): the tokenized corpus, each source's statistics
    and each document's first token."""
    eos, bos = tok_meta["eos_id"], tok_meta["bos_id"]
    byte_level = data.tokenizer.type == "byte"
    stats = [SourceStats() for _ in data.sources]
    if _is_labelled(data):
        rules = LabelRules(byte_level, tok_meta["vocab_size"], data.seq_len + 1,
                           1 + (bos is not None))
        tok = tokenize_labelled(data, rules, eos, bos, dtype, tmp / PACK_TOKENS,
                                tmp / PACK_LABELS, stats)
        hashes[PACK_LABELS] = tok.labels_sha256
    else:
        enc = TokenEncoder(tokenizer, byte_level=byte_level)
        tok = tokenize_corpus(data, enc, eos, bos, dtype, tmp / PACK_TOKENS, stats)
    doc_start = np.cumsum(tok.doc_len) - tok.doc_len
    hashes[PACK_TOKENS] = tok.tokens_sha256
    _save(tmp, "docs.npy", np.stack([doc_start, tok.doc_len], axis=1), hashes)
    _save(tmp, "answer_spans.npy", tok.answer_spans, hashes)
    _save(tmp, "levels.npy", tok.doc_level, hashes)
    return tok, stats, doc_start


def _pack_epochs(data: DataConfig, tmp: Path, doc_start: np.ndarray, tok: TokenizedCorpus,
                 train_docs: np.ndarray, hashes: dict[str, str]
                 ) -> tuple[int, float, dict[str, Any] | None]:
    """Every epoch's training rows into ``train/epoch_{e}``: (rows per epoch, fill ratio of
    the last epoch, epoch 0's curriculum report or None)."""
    row_len = data.seq_len + 1
    rows_per_epoch, fill, curriculum = 0, 0.0, None
    for epoch in tqdm(range(data.epochs), desc="packing", unit="epoch", disable=None):
        rng = np.random.default_rng([data.seed, _EPOCH, epoch])
        if data.curriculum_fraction > 0:
            packed, row_level = pack_documents_by_level(
                doc_start[train_docs], tok.doc_len[train_docs], tok.doc_level[train_docs],
                row_len, rng, data.curriculum_fraction if epoch == 0 else 0.0)
            if epoch == 0:
                curriculum = _curriculum_report(data.curriculum_fraction, row_level)
        else:
            packed = pack_documents(doc_start[train_docs], tok.doc_len[train_docs], row_len, rng)
        # Ties only change row contents, never the row count (see packing.pack_documents).
        assert epoch == 0 or packed.num_rows == rows_per_epoch
        rows_per_epoch, fill = packed.num_rows, fill_ratio(packed, row_len)
        _save_rows(tmp, f"train/epoch_{epoch}", packed, hashes)
    return rows_per_epoch, fill, curriculum


def _save_tokenizer(data: DataConfig, tmp: Path) -> tuple[Any, dict[str, Any]]:
    """The pack's tokenizer, saved as tokenizer.json, and its entries in metadata.json."""
    tokenizer, info = _build_tokenizer(data)
    tokenizer.save(str(tmp / "tokenizer.json"))
    return tokenizer, {
        "vocab_size": info.vocab_size if info else tokenizer.get_vocab_size(),
        "eos_id": eos_id(tokenizer),
        "pad_id": pad_id(tokenizer),
        "bos_id": info.bos_id if info else None,  # starts every document; null: none does
        "tokenizer": asdict(data.tokenizer),
        "tokenizer_source": info.to_json() if info else None,  # a file tokenizer's
        "tokenizer_sha256": file_sha256(tmp / "tokenizer.json"),
    }


def _is_labelled(data: DataConfig) -> bool:
    """Whether ``data`` packs labelled records (its sources are all labelled, or none is)."""
    return any(src.type == "labelled" for src in data.sources)


def _write_pack(data: DataConfig, tmp: Path) -> dict[str, Any]:
    row_len = data.seq_len + 1
    tokenizer, tok_meta = _save_tokenizer(data, tmp)
    dtype = _token_dtype(data, tok_meta["vocab_size"])
    hashes: dict[str, str] = {}
    tok, stats, doc_start = _write_documents(data, tmp, tokenizer, tok_meta, dtype, hashes)
    num_docs = len(tok.doc_len)
    heldout = np.array([s.heldout for s in data.sources], dtype=bool)[tok.doc_source]

    train_idx, val_idx = validation_split(data, heldout)
    train_docs = repeat_by_weight(data, train_idx, tok.doc_source)
    if train_docs.size == 0:
        raise DataError("no training documents are left after the validation split and source "
                        "weights; lower data.val_fraction or raise data.sources[*].weight")
    rows_per_epoch, fill, curriculum = _pack_epochs(data, tmp, doc_start, tok, train_docs, hashes)
    val = pack_documents(doc_start[val_idx], tok.doc_len[val_idx], row_len,
                         np.random.default_rng([data.seed, _VAL]))
    _save_rows(tmp, "val", val, hashes)

    sources = _source_report(data, stats, tok)
    meta: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "layout": LAYOUT_LABELLED if _is_labelled(data) else LAYOUT,
        "labelled": _is_labelled(data),
        "label_dtype": LABEL_DTYPE.name if _is_labelled(data) else None,
        "data_id": data_id(data),
        **tok_meta,
        "token_dtype": dtype.name,
        "seq_len": data.seq_len,
        "row_len": row_len,
        "num_docs": num_docs,
        "num_train_docs": int(train_docs.size),
        "num_val_docs": int(val_idx.size),
        "total_tokens": int(tok.doc_len.sum()),
        "train_tokens_per_epoch": int(tok.doc_len[train_docs].sum()),
        "val_tokens": int(tok.doc_len[val_idx].sum()),
        "num_epochs": data.epochs,
        "rows_per_epoch": rows_per_epoch,
        "val_rows": val.num_rows,
        "fill_ratio": fill,
        "val_fill_ratio": fill_ratio(val, row_len),
        "split_docs": int((tok.doc_len[train_docs] > row_len).sum()),
        "answer_docs": int((tok.answer_spans[:, 1] > 0).sum()),
        "answer_span_version": ANSWER_SPAN_VERSION,  # 2: spans end with the EOS
        "level_docs": int((tok.doc_level >= 0).sum()),
        "train_levels": sorted(set(tok.doc_level[train_idx].tolist()) - {-1}),
        "heldout_docs": int(heldout.sum()),
        "curriculum": curriculum,
        "seed": data.seed,
        "val_fraction": data.val_fraction,
        "invalid_utf8_docs": sum(s["invalid_utf8_docs"] for s in sources),
        "invalid_utf8_sequences": sum(s["invalid_utf8_sequences"] for s in sources),
        "sources": sources,
        "arrays": hashes,
    }
    # over the JSON round trip (what a reader sees), so a flipped byte in it is noticed too
    meta[SELF_HASH_KEY] = metadata_digest(json.loads(json.dumps(meta)))
    (tmp / PACK_METADATA).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def is_pack_dir(path: Path) -> bool:
    """Whether ``path`` holds a data pack this module wrote (its metadata.json's layout,
    causal-LM or labelled)."""
    try:
        meta = json.loads((Path(path) / PACK_METADATA).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("layout") in (LAYOUT, LAYOUT_LABELLED)


def _write_error(out_dir: Path, exc: OSError) -> str:
    blocker = next((p for p in out_dir.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return (f"cannot write the data pack {out_dir}: {blocker} is a file, not a directory; "
                "point experiment.results_dir (or --out) at a directory")
    where = f" ({exc.filename})" if exc.filename else ""
    return (f"cannot write the data pack {out_dir}: {exc.strerror or exc}{where}; free space "
            "there, or point experiment.results_dir (or --out) at a writable directory")


def pack_corpus(data: DataConfig, out_dir: Path) -> dict[str, Any]:
    """Pack the corpus of ``data`` into ``out_dir``; returns metadata. A previous pack there
    is replaced; any other non-empty directory is refused before anything is read.

    Raises ConfigError / DataError (one line, naming the key or file) before writing
    anything when it can, and removes its temporary directory when it fails later.
    """
    out_dir = Path(out_dir)
    _check_config(data)
    for index, src in enumerate(data.sources):
        check_source(index, src, warn=True)
    check_output_dir(out_dir, "data pack output", owned=is_pack_dir,
                     kind=f"a data pack (no metadata.json with layout {LAYOUT!r} or "
                     f"{LAYOUT_LABELLED!r})")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise DataError(_write_error(out_dir, exc)) from None
    try:
        meta = _write_pack(data, tmp)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and is_write_failure(exc, tmp, out_dir):
            raise DataError(_write_error(out_dir, exc)) from None
        raise
    log.info("packed %d documents, %d tokens into %d rows/epoch × %d epochs (fill %.4f): %s",
             meta["num_docs"], meta["total_tokens"], meta["rows_per_epoch"],
             meta["num_epochs"], meta["fill_ratio"], out_dir)
    return meta
