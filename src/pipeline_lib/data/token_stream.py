"""The corpus streamed through the tokenizer into ``tokens.bin``, one document after another.

A document is laid out as ``[BOS] text answer EOS``: the BOS only when the tokenizer's source
asks for one (``data.tokenizer.add_bos``), the answer only for documents that have one
(reasoning problems, jsonl/parquet prompt + answer records). Its answer span is recorded as
(offset in the document, length) and covers the answer and the EOS after it, so that answer
objectives teach a model to stop after its answer; a BOS shifts every offset by one. Only
per-document numbers stay in memory.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import DataError
from ..spec.config import DataConfig
from .sources import RawDocument, SourceStats, iter_documents, warn_source_problems
from .tokenizer import TokenEncoder

log = logging.getLogger(__name__)

BATCH_DOCS = 1024  # documents per tokenizer batch…
BATCH_CHARS = 4 << 20  # …or this many characters, whichever comes first


@dataclass
class TokenizedCorpus:
    """Per-document numbers of a tokenized corpus (its tokens are in ``tokens.bin``)."""

    doc_len: np.ndarray  # int64 [docs], tokens incl. BOS and EOS
    doc_source: np.ndarray  # int64 [docs], index into data.sources
    answer_spans: np.ndarray  # int64 [docs, 2], (offset in doc, length incl. EOS); (0, 0) if none
    doc_level: np.ndarray  # int64 [docs], difficulty level; -1 = unknown
    tokens_sha256: str


def all_documents(data: DataConfig, stats: list[SourceStats]
                  ) -> Iterator[tuple[int, RawDocument]]:
    """(source index, document) of every source in order; ``stats`` is filled on the way."""
    for index, src in enumerate(data.sources):
        for doc in iter_documents(index, src, stats[index]):
            yield index, doc


def _batches(docs: Iterator[tuple[int, RawDocument]]) -> Iterator[list[tuple[int, RawDocument]]]:
    batch, chars = [], 0
    for item in docs:
        batch.append(item)
        chars += len(item[1].text)
        if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


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


def _empty_corpus_error(data: DataConfig) -> DataError:
    where = ", ".join(f"data.sources[{i}] ({s.type}" + (f" {s.path!r})" if s.path else ")")
                      for i, s in enumerate(data.sources))
    return DataError(f"the corpus is empty: {where} produced no non-empty documents; "
                     "add documents or fix the source paths")


def tokenize_corpus(data: DataConfig, enc: TokenEncoder, eos: int, bos: int | None,
                    dtype: np.dtype, path: Path, stats: list[SourceStats]) -> TokenizedCorpus:
    """Stream every source through the tokenizer into ``path``; keep only per-doc numbers."""
    lens, sources, span_off, span_len, levels = [], [], [], [], []
    sha = hashlib.sha256()
    bar = tqdm(desc="tokenizing", unit="doc", disable=None)
    with open(path, "wb") as fh:
        for batch in _batches(all_documents(data, stats)):
            ids, doc_len, ans_off, ans_len = assemble_documents(enc, batch, eos, bos)
            blob = ids.astype(dtype).tobytes()
            fh.write(blob)
            sha.update(blob)
            lens.append(doc_len)
            sources.append(np.fromiter((i for i, _ in batch), np.int64, len(batch)))
            span_off.append(ans_off)
            span_len.append(ans_len)
            levels.append(np.fromiter((d.level for _, d in batch), np.int64, len(batch)))
            bar.update(len(batch))
    bar.close()
    if not lens:
        raise _empty_corpus_error(data)
    for i, st in enumerate(stats):
        if st.num_docs == 0:
            log.warning("data.sources[%d] (%s) produced no documents", i, data.sources[i].type)
        warn_source_problems(i, data.sources[i], st)
    spans = np.stack([np.concatenate(span_off), np.concatenate(span_len)], axis=1)
    return TokenizedCorpus(np.concatenate(lens), np.concatenate(sources), spans,
                           np.concatenate(levels), sha.hexdigest())
