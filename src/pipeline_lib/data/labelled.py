"""Labelled records (sequence labelling): a label, or none, for every input token.

A ``labelled`` source reads JSON lines, one record per line, from the files of its ``path``
glob (or generates them, :mod:`.labelled_tasks`), in one of two shapes:

- text, byte tokenizer only: ``{"input": "1011|0", "labels": ["1", "1", "0", "1", null,
  "0"], "level": 3}``: a label (one byte: a single ASCII character) or null per character
  of ``input``; a label sits on its character's token (a character of several UTF-8 bytes:
  on its last byte, the others get none);
- token ids, any tokenizer: ``{"input_ids": [5, 9, 2], "labels": [7, -100, 3]}``: a label
  per id, -100 (``IGNORE_INDEX``) = none; ids and labels lie in [0, vocab_size).

``level`` is optional (an integer >= 0; absent = -1, unknown). A record must label at least
one token, and its tokens with the EOS (and the BOS, where the tokenizer has one) must fit
one row of ``data.seq_len + 1``: a labelled document is never split, as its labels need the
whole context before them. A bad record is a one-line :class:`DataError` naming
``data.sources[i]``, the file and the line (1-based) and the fix, raised while the pack is
written into its temporary directory (removed then: nothing is left).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..spec.config import SourceConfig
from ..spec.names import IGNORE_INDEX
from .labelled_tasks import iter_task_records
from .sources import SourceStats, check_source


@dataclass(frozen=True)
class LabelRules:
    """What a record must satisfy in this pack."""

    byte_level: bool  # text records are read byte by byte (the byte tokenizer)
    vocab_size: int  # ids and labels lie in [0, vocab_size)
    row_len: int  # data.seq_len + 1: a document with its EOS (and BOS) fits one row
    extra: int  # tokens added to every document: the EOS, and the BOS where there is one


@dataclass(frozen=True)
class LabelledDocument:
    """One record as tokens: the input's ids and their labels (int64, equal lengths,
    :data:`IGNORE_INDEX` = none; no BOS or EOS yet) and its level (-1 = unknown)."""

    ids: np.ndarray
    labels: np.ndarray
    level: int = -1


def _int_list(record: dict, key: str, where: str) -> np.ndarray:
    values = record[key]
    if not isinstance(values, list) or not all(type(v) is int for v in values):
        raise DataError(f"{where}: {key!r} must be a list of integers; fix the record")
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:  # ids beyond int64 are outside every vocabulary
        return np.full(len(values), -1, dtype=np.int64)


def _check_vocab(values: np.ndarray, key: str, rules: LabelRules, where: str,
                 none: int | None = None) -> None:
    bad = (values < 0) | (values >= rules.vocab_size)
    if none is not None:
        bad &= values != none
    if bad.any():
        j = int(np.argmax(bad))
        spare = f", or {none} for no label" if none is not None else ""
        raise DataError(f"{where}: {key}[{j}] = {int(values[j])} is outside the vocabulary "
                        f"[0, {rules.vocab_size}); use ids below {rules.vocab_size}{spare}")


def _id_record(record: dict, rules: LabelRules, where: str) -> tuple[np.ndarray, np.ndarray]:
    ids, labels = _int_list(record, "input_ids", where), _int_list(record, "labels", where)
    if len(labels) != len(ids):
        raise DataError(f"{where}: {len(labels)} labels for {len(ids)} input_ids; give one "
                        f"label per id ({IGNORE_INDEX} = none)")
    _check_vocab(ids, "input_ids", rules, where)
    _check_vocab(labels, "labels", rules, where, none=IGNORE_INDEX)
    return ids, labels


def _text_record(record: dict, rules: LabelRules, where: str) -> tuple[np.ndarray, np.ndarray]:
    if not rules.byte_level:
        raise DataError(f"{where}: a text record ('input') is read byte by byte, which only "
                        "data.tokenizer.type byte does; give token ids as 'input_ids' instead")
    text, marks = record["input"], record["labels"]
    if not isinstance(text, str) or not isinstance(marks, list):
        raise DataError(f"{where}: 'input' must be a string and 'labels' a list; fix the record")
    if len(marks) != len(text):
        raise DataError(f"{where}: {len(marks)} labels for {len(text)} characters of 'input'; "
                        "give one label (or null) per character")
    parts = [ch.encode("utf-8", errors="replace") for ch in text]
    ids = np.frombuffer(b"".join(parts), dtype=np.uint8).astype(np.int64)
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    last_byte = np.cumsum([len(p) for p in parts], dtype=np.int64) - 1
    for j, mark in enumerate(marks):
        if mark is None:
            continue
        if not isinstance(mark, str) or len(mark.encode("utf-8", errors="replace")) != 1:
            raise DataError(f"{where}: labels[{j}] = {mark!r} is not one byte token; use a "
                            "single ASCII character (or null for no label)")
        labels[last_byte[j]] = mark.encode()[0]
    return ids, labels


def _level(record: dict, where: str) -> int:
    level = record.get("level", -1)
    if "level" in record and (type(level) is not int or level < 0):
        raise DataError(f"{where}: level {level!r} is not an integer >= 0; fix it or leave "
                        "'level' out (unknown)")
    return level


def record_document(record: Any, rules: LabelRules, where: str) -> LabelledDocument:
    """The document of one record (``where`` names it in errors), checked against ``rules``."""
    if not isinstance(record, dict) or "labels" not in record \
            or ("input" in record) == ("input_ids" in record):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{where}: expected an object with 'labels' and either 'input' or "
                        f"'input_ids' (got {keys}); fix the record")
    parse = _text_record if "input" in record else _id_record
    ids, labels = parse(record, rules, where)
    level = _level(record, where)
    if not (labels != IGNORE_INDEX).any():
        raise DataError(f"{where}: no token has a label; label at least one or drop the record")
    if len(ids) + rules.extra > rules.row_len:
        need = len(ids) + rules.extra
        raise DataError(f"{where}: {need} tokens with the EOS/BOS exceed a row of data.seq_len "
                        f"+ 1 = {rules.row_len}; raise data.seq_len to at least {need - 1} (a "
                        "labelled document is never split: its labels need all of it)")
    return LabelledDocument(ids, labels, level)


def _file_records(path: Path, where: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) of every non-blank line of ``path``, streamed."""
    try:
        with open(path, "rb") as fh:
            for number, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as exc:  # also invalid UTF-8
                    raise DataError(f"{where}: line {number} of {path} is not JSON "
                                    f"({str(exc)[:60]}); write one JSON object per "
                                    "line") from None
                yield number, record
    except OSError as exc:
        raise DataError(f"{where}: cannot read {path} ({exc.strerror or exc}); make it "
                        "readable by this user or remove it from the source") from None


def iter_labelled_documents(index: int, src: SourceConfig, rules: LabelRules,
                            stats: SourceStats) -> Iterator[LabelledDocument]:
    """The documents of the labelled ``data.sources[index]``, at most ``max_docs``: its
    files' records in order, or its built-in tasks' records without a path."""
    where = f"data.sources[{index}] (labelled, path {src.path!r})"
    if src.path:
        records = ((f"{where}: line {n} of {path}", record)
                   for path in check_source(index, src) for n, record in
                   _file_records(path, where))
    else:
        records = ((f"data.sources[{index}] (labelled, built-in {task})", record)
                   for task, record in iter_task_records(src))
    for name, record in records:
        doc = record_document(record, rules, name)
        stats.num_docs += 1
        yield doc
        if src.max_docs and stats.num_docs >= src.max_docs:
            return
