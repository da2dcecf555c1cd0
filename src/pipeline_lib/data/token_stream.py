"""The corpus streamed through the tokenizer into ``tokens.bin``, one document after another.

A document is laid out as ``[BOS] text answer EOS``: the BOS only when the tokenizer's source
asks for one (``data.tokenizer.add_bos``), the answer only for documents that have one
(reasoning problems, jsonl/parquet prompt + answer records). Its answer span is recorded as
(offset in the document, length) and covers the answer and the EOS after it, so that answer
objectives teach a model to stop after its answer; a BOS shifts every offset by one. Only
per-document numbers stay in memory.

A labelled pack's documents (:mod:`.labelled`) are ``[BOS] tokens EOS`` too, and their labels
go to ``labels.bin`` alongside: one int32 per token of ``tokens.bin``, the token's label or
``IGNORE_INDEX`` (-100) where it has none (always at the BOS and the EOS).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ..errors import DataError
from ..spec.config import DataConfig
from ..spec.names import IGNORE_INDEX
from .labelled import LabelledDocument, LabelRules, iter_labelled_documents
from .sources import RawDocument, SourceStats, iter_documents, warn_source_problems
from .tokenizer import TokenEncoder

log = logging.getLogger(__name__)

BATCH_DOCS = 1024  # documents per tokenizer batch…
BATCH_CHARS = 4 << 20  # …or this many characters, whichever comes first
LABEL_DTYPE = np.dtype("int32")  # labels.bin: a label id, or IGNORE_INDEX, per token


@dataclass
class TokenizedCorpus:
    """Per-document numbers of a tokenized corpus (its tokens are in ``tokens.bin``)."""

    doc_len: np.ndarray  # int64 [docs], tokens incl. BOS and EOS
    doc_source: np.ndarray  # int64 [docs], index into data.sources
    answer_spans: np.ndarray  # int64 [docs, 2], (offset in doc, length incl. EOS); (0, 0) if none
    doc_level: np.ndarray  # int64 [docs], difficulty level; -1 = unknown
    tokens_sha256: str
    labels_sha256: str | None = None  # labels.bin's, in a labelled pack


@dataclass(frozen=True)
class _Chunk:
    """A batch of documents laid out as tokens (and, in a labelled pack, their labels)."""

    ids: np.ndarray  # int64 [tokens]
    doc_len: np.ndarray  # int64 [docs]
    doc_source: np.ndarray  # int64 [docs]
    answer_off: np.ndarray  # int64 [docs]
    answer_len: np.ndarray  # int64 [docs]
    doc_level: np.ndarray  # int64 [docs]
    labels: np.ndarray | None = None  # int64 [tokens]


_PER_DOC = ("doc_len", "doc_source", "answer_off", "answer_len", "doc_level")  # kept in memory


def all_documents(data: DataConfig, stats: list[SourceStats]
                  ) -> Iterator[tuple[int, RawDocument]]:
    """(source index, document) of every source in order; ``stats`` is filled on the way."""
    for index, src in enumerate(data.sources):
        for doc in iter_documents(index, src, stats[index]):
            yield index, doc


def _batches(docs: Iterator[tuple[int, Any]], chars: Callable[[Any], int]
             ) -> Iterator[list[tuple[int, Any]]]:
    batch, total = [], 0
    for item in docs:
        batch.append(item)
        total += chars(item[1])
        if len(batch) >= BATCH_DOCS or total >= BATCH_CHARS:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def _numbers(batch: list[tuple[int, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(source index, level) of every document of a batch, int64."""
    return (np.fromiter((i for i, _ in batch), np.int64, len(batch)),
            np.fromiter((d.level for _, d in batch), np.int64, len(batch)))


def assemble_documents(enc: TokenEncoder, batch: list[tuple[int, RawDocument]], eos: int,
                       bos: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Tokens of a batch laid out as [BOS] + text + answer + EOS per document.

    Returns (ids int64 [tokens], doc_len, answer_offset, answer_len), each int64 [docs];
    answer_offset is where the answer starts in its document (after the BOS and the text)
    and answer_len counts the answer's tokens and the EOS that ends it, where there is an
    answer, else both are 0 (``identity.ANSWER_SPAN_VERSION`` 2).
    """
    lead = 0 if bos is None else 1
    text_ids, text_len = enc.encode_batch([d.text for _, d in batch])
    has_answer = any(d.answer for _, d in batch)
    if has_answer:
        ans_ids, ans_len = enc.encode_batch([d.answer for _, d in batch])
    else:
        ans_ids, ans_len = np.zeros(0, np.int64), np.zeros(len(batch), np.int64)
    doc_len = lead + text_len + ans_len + 1
    doc_start = np.cumsum(doc_len) - doc_len
    out = np.empty(int(doc_len.sum()), dtype=np.int64)
    if bos is not None:
        out[doc_start] = bos
    text_first = np.cumsum(text_len) - text_len
    out[np.repeat(doc_start + lead - text_first, text_len) + np.arange(len(text_ids))] = text_ids
    if has_answer:
        ans_first = np.cumsum(ans_len) - ans_len
        ans_pos = np.repeat(doc_start + lead + text_len - ans_first, ans_len) \
            + np.arange(len(ans_ids))
        out[ans_pos] = ans_ids
    out[doc_start + doc_len - 1] = eos
    has = ans_len > 0
    return out, doc_len, np.where(has, lead + text_len, 0), np.where(has, ans_len + 1, 0)


def assemble_labelled(batch: list[tuple[int, LabelledDocument]], eos: int, bos: int | None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, labels, doc_len), int64, of a batch laid out as [BOS] + tokens + EOS per
    document; the BOS and the EOS have no label."""
    head = np.array([] if bos is None else [bos], dtype=np.int64)
    tail = np.array([eos], dtype=np.int64)
    unlabelled = np.full(len(head), IGNORE_INDEX, dtype=np.int64), np.array([IGNORE_INDEX])
    ids = np.concatenate([a for _, d in batch for a in (head, d.ids, tail)])
    labels = np.concatenate([a for _, d in batch for a in (unlabelled[0], d.labels,
                                                            unlabelled[1])])
    doc_len = np.fromiter((len(head) + len(d.ids) + 1 for _, d in batch), np.int64, len(batch))
    return ids, labels, doc_len


def _text_chunks(data: DataConfig, enc: TokenEncoder, eos: int, bos: int | None,
                 stats: list[SourceStats]) -> Iterator[_Chunk]:
    for batch in _batches(all_documents(data, stats), lambda d: len(d.text)):
        ids, doc_len, ans_off, ans_len = assemble_documents(enc, batch, eos, bos)
        source, level = _numbers(batch)
        yield _Chunk(ids, doc_len, source, ans_off, ans_len, level)


def _labelled_chunks(data: DataConfig, rules: LabelRules, eos: int, bos: int | None,
                     stats: list[SourceStats]) -> Iterator[_Chunk]:
    docs = ((index, doc) for index, src in enumerate(data.sources)
            for doc in iter_labelled_documents(index, src, rules, stats[index]))
    for batch in _batches(docs, lambda d: len(d.ids)):
        ids, labels, doc_len = assemble_labelled(batch, eos, bos)
        none = np.zeros(len(batch), np.int64)
        source, level = _numbers(batch)
        yield _Chunk(ids, doc_len, source, none, none, level, labels)


def _empty_corpus_error(data: DataConfig) -> DataError:
    where = ", ".join(f"data.sources[{i}] ({s.type}" + (f" {s.path!r})" if s.path else ")")
                      for i, s in enumerate(data.sources))
    return DataError(f"the corpus is empty: {where} produced no non-empty documents; "
                     "add documents or fix the source paths")


def _write_chunks(data: DataConfig, chunks: Iterator[_Chunk], dtype: np.dtype, path: Path,
                  labels_path: Path | None, stats: list[SourceStats]) -> TokenizedCorpus:
    """Append every chunk's tokens to ``path`` (and labels to ``labels_path``); keep only
    per-document numbers."""
    numbers: list[tuple[np.ndarray, ...]] = []  # per chunk: _PER_DOC's arrays
    sha, label_sha = hashlib.sha256(), hashlib.sha256()
    bar = tqdm(desc="tokenizing", unit="doc", disable=None)
    with open(path, "wb") as fh, \
            (open(labels_path, "wb") if labels_path else contextlib.nullcontext()) as lh:
        for chunk in chunks:
            blob = chunk.ids.astype(dtype).tobytes()
            fh.write(blob)
            sha.update(blob)
            if lh is not None:
                blob = chunk.labels.astype(LABEL_DTYPE).tobytes()
                lh.write(blob)
                label_sha.update(blob)
            numbers.append(tuple(getattr(chunk, name) for name in _PER_DOC))
            bar.update(len(chunk.doc_len))
    bar.close()
    if not numbers:
        raise _empty_corpus_error(data)
    for i, st in enumerate(stats):
        if st.num_docs == 0:
            log.warning("data.sources[%d] (%s) produced no documents", i, data.sources[i].type)
        warn_source_problems(i, data.sources[i], st)
    columns = [np.concatenate(column) for column in zip(*numbers, strict=True)]
    doc_len, doc_source, answer_off, answer_len, doc_level = columns
    return TokenizedCorpus(doc_len, doc_source, np.stack([answer_off, answer_len], axis=1),
                           doc_level, sha.hexdigest(),
                           label_sha.hexdigest() if labels_path else None)


def tokenize_corpus(data: DataConfig, enc: TokenEncoder, eos: int, bos: int | None,
                    dtype: np.dtype, path: Path, stats: list[SourceStats]) -> TokenizedCorpus:
    """Stream every source through the tokenizer into ``path``; keep only per-doc numbers."""
    return _write_chunks(data, _text_chunks(data, enc, eos, bos, stats), dtype, path, None,
                         stats)


def tokenize_labelled(data: DataConfig, rules: LabelRules, eos: int, bos: int | None,
                      dtype: np.dtype, path: Path, labels_path: Path,
                      stats: list[SourceStats]) -> TokenizedCorpus:
    """Every labelled source's records into ``path`` (tokens) and ``labels_path`` (their
    labels, :data:`LABEL_DTYPE`), checked against ``rules``; keep only per-doc numbers."""
    return _write_chunks(data, _labelled_chunks(data, rules, eos, bos, stats), dtype, path,
                         labels_path, stats)
