"""Corpus sources streamed in bounded memory: parquet, jsonl, text files, stdlib, reasoning.

Every source yields :class:`RawDocument` values one at a time; parquet and jsonl are read
through pyarrow in record batches, so memory is bounded by a batch, not by the file.
Problems a user can cause (a glob that matches nothing, a missing column, a corrupt file)
raise :class:`~pipeline_lib.errors.DataError` naming ``data.sources[i]`` and the file.
Invalid UTF-8 is decoded with replacement characters and counted, never fatal; documents
without text (empty or whitespace only) are skipped and counted. Both are warned about once
per source, naming the files (:func:`warn_source_problems`). A glob reads every file once:
symlink loops are not followed and a file reached by several paths is read under one
(:func:`~pipeline_lib.spec.data_id.glob_source`, warned about by :func:`check_source`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from ..errors import DataError
from ..spec.config import SourceConfig
from ..spec.data_id import SourceGlob, glob_source, is_file_source, stdlib_dir
from .reasoning import iter_reasoning_problems

log = logging.getLogger(__name__)

BATCH_ROWS = 512  # rows per pyarrow record batch: bounds memory for large files
JSON_BLOCK_BYTES = 16 << 20  # one JSON line must fit in a block
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
MAX_NAMED_FILES = 10  # files named per problem in metadata.json and the warning


@dataclass(frozen=True)
class RawDocument:
    """One document: ``text``, then ``answer`` (whose tokens are recorded as the answer span;
    reasoning, or a jsonl/parquet source with ``answer_field``), and its ``level`` (reasoning:
    the difficulty; jsonl/parquet: ``level_field``; -1 = unknown) and the ``file`` it came
    from (empty for generated documents)."""

    text: str
    answer: str = ""
    level: int = -1
    file: str = ""


@dataclass
class SourceStats:
    """Counts gathered while a source is read (reported in metadata.json); the ``*_files``
    tables count per file, for the first :data:`MAX_NAMED_FILES` files with the problem."""

    num_docs: int = 0
    skipped_empty: int = 0
    invalid_utf8_docs: int = 0
    invalid_utf8_sequences: int = 0
    skipped_empty_files: dict[str, int] = field(default_factory=dict)
    invalid_utf8_files: dict[str, int] = field(default_factory=dict)

    def note_skipped(self, file: str) -> None:
        self.skipped_empty += 1
        _tally(self.skipped_empty_files, file)


def _tally(table: dict[str, int], file: str) -> None:
    if file in table or len(table) < MAX_NAMED_FILES:
        table[file] = table.get(file, 0) + 1


def decode_utf8(raw: bytes, stats: SourceStats, file: str | Path = "") -> str:
    """Decode UTF-8; invalid sequences become U+FFFD, counted in ``stats`` (and per ``file``)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        stats.invalid_utf8_docs += 1
        stats.invalid_utf8_sequences += text.count("\ufffd") - raw.count("\ufffd".encode())
        _tally(stats.invalid_utf8_files, str(file))
        return text


def warn_source_problems(index: int, src: SourceConfig, stats: SourceStats) -> None:
    """One warning per kind of problem met while reading ``data.sources[index]``, naming
    the files: documents skipped for having no text, documents decoded with replacements."""
    if stats.skipped_empty:
        what = ("an empty or whitespace-only file" if src.type in ("text", "stdlib") else
                f"a null, missing, empty or whitespace-only {_text_fields(src)[0]!r}")
        log.warning("%s: skipped %d document(s) with no text (%s): %s", _where(index, src),
                    stats.skipped_empty, what, _named(stats.skipped_empty_files,
                                                      stats.skipped_empty))
    if stats.invalid_utf8_docs:
        log.warning("%s: %d document(s) are not valid UTF-8 (binary files?); packed with %d "
                    "invalid sequence(s) replaced by U+FFFD: %s", _where(index, src),
                    stats.invalid_utf8_docs, stats.invalid_utf8_sequences,
                    _named(stats.invalid_utf8_files, stats.invalid_utf8_docs))


def _named(table: dict[str, int], total: int) -> str:
    text = ", ".join(f"{name} ({count})" for name, count in table.items())
    rest = total - sum(table.values())
    return text + (f" and {rest} more in other files" if rest else "")


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` sources, sorted, without tests and site-packages."""
    root = stdlib_dir()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        out += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(out)


def _where(index: int, src: SourceConfig) -> str:
    return f"data.sources[{index}] ({src.type}, path {src.path!r})"


def warn_glob_problems(index: int, src: SourceConfig, found: SourceGlob) -> None:
    """One warning each for the symlink loops the glob of ``data.sources[index]`` did not
    follow and for the files it matched by several paths (each read once)."""
    if found.loops:
        links = [f"{link} -> {os.path.realpath(link)}" for link in found.loops]
        log.warning("%s: did not follow %d symlinked director%s that lead%s back into a parent "
                    "directory (a loop; every file is read once): %s", _where(index, src),
                    len(links), "y" if len(links) == 1 else "ies",
                    "s" if len(links) == 1 else "", _listed(links))
    if found.duplicates:
        named = [f"{skipped} (same file as {kept})" for skipped, kept in found.duplicates]
        log.warning("%s: %d path(s) name a file the glob already matched; each file is read "
                    "once: %s", _where(index, src), len(named), _listed(named))


def _listed(items: list[str]) -> str:
    rest = len(items) - MAX_NAMED_FILES
    return ", ".join(items[:MAX_NAMED_FILES]) + (f" and {rest} more" if rest > 0 else "")


def check_source(index: int, src: SourceConfig, *, warn: bool = False) -> list[Path]:
    """Fail early, before any output exists: files present, parquet readable with its columns,
    the first record of every jsonl file holding the prompt/answer/level keys. ``warn``: also
    warn about symlink loops and files matched twice (once per pack, not per pass)."""
    if not is_file_source(src):
        return []
    found = glob_source(src)
    files = found.files
    if warn:
        warn_glob_problems(index, src, found)
    if not files:
        hint = "a directory; use a glob such as DIR/*" if os.path.isdir(src.path) else "no files"
        raise DataError(f"{_where(index, src)} matches {hint}; point data.sources[{index}].path "
                        "at existing files")
    for path in (p for p in files if not os.access(p, os.R_OK)):  # the OS says why, early
        read_corpus_file(path, f"{_where(index, src)}: ")
    if src.type == "parquet":
        for path in files:
            _check_parquet_schema(index, src, path, _open_parquet(index, src, path))
    elif src.type == "jsonl":
        for path in files:
            _check_jsonl_first_record(index, src, path)
    return files


def _text_fields(src: SourceConfig) -> list[str]:
    """The text columns/keys read: the prompt and the answer, or the text alone."""
    return [src.prompt_field, src.answer_field] if src.prompt_field else [src.text_field]


def _field_key(src: SourceConfig, name: str) -> str:
    """The config key that names column ``name`` (for the fix in an error message)."""
    for key in ("prompt_field", "answer_field", "level_field"):
        if getattr(src, key) == name:
            return key
    return "text_field"


def _open_parquet(index: int, src: SourceConfig, path: Path):
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{_where(index, src)}: {path} is not a readable Parquet file "
                        f"({_first_line(exc)}); replace or remove it") from None


def _check_parquet_schema(index: int, src: SourceConfig, path: Path, pf) -> None:
    schema = pf.schema_arrow
    wanted = _text_fields(src) + ([src.level_field] if src.level_field else [])
    for name in wanted:
        if name not in schema.names:
            raise DataError(f"{_where(index, src)}: {path} has no column {name!r} (columns: "
                            f"{schema.names}); set data.sources[{index}].{_field_key(src, name)}")
    for name in _text_fields(src):
        kind = schema.field(name).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
            raise DataError(f"{_where(index, src)}: column {name!r} of {path} has type "
                            f"{kind}, not text; set data.sources[{index}]."
                            f"{_field_key(src, name)} to a string column")
    if src.level_field and not pa.types.is_integer(schema.field(src.level_field).type):
        raise DataError(f"{_where(index, src)}: level column {src.level_field!r} of {path} has "
                        f"type {schema.field(src.level_field).type}, not an integer; cast it to "
                        f"int64 or set data.sources[{index}].level_field to an integer column")


def _check_jsonl_first_record(index: int, src: SourceConfig, path: Path) -> None:
    """The first JSON object of ``path`` must hold every prompt/answer/level key (a typo in a
    field name fails here, before the pack starts). Unparsable lines are left to the reader."""
    keys = [k for k in (src.prompt_field, src.answer_field, src.level_field) if k]
    if not keys:
        return
    with open(path, "rb") as fh:
        line = next((raw for raw in fh if raw.strip()), None)
    try:
        record = json.loads(line) if line is not None else None
    except ValueError:
        return
    if not isinstance(record, dict):
        return
    for key in keys:
        if key not in record:
            raise DataError(f"{_where(index, src)}: the first record of {path} has no key "
                            f"{key!r} (keys: {sorted(record)}); set data.sources[{index}]."
                            f"{_field_key(src, key)} or fix the file")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _column_texts(column, stats: SourceStats, path: Path) -> list[str | None]:
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return [None if raw is None else decode_utf8(raw, stats, path)
                for raw in column.to_pylist()]
    return column.to_pylist()


def is_blank(doc: RawDocument) -> bool:
    """Whether ``doc`` has no text to train on: empty, or whitespace only (skipped, counted)."""
    return not doc.text.strip() and not doc.answer.strip()


def _batch_documents(index: int, src: SourceConfig, path: Path, batch, first_record: int,
                     stats: SourceStats) -> Iterator[RawDocument]:
    """The documents of one record batch (record numbers from ``first_record``, 1-based).

    Text mode: a missing, empty or whitespace-only text gives a blank document (skipped by
    the caller). Prompt/answer mode: a missing prompt, a missing, empty or whitespace-only
    answer, and (both modes) a missing, negative or non-integer level are one-line errors
    naming the record.
    """
    columns = [_column_texts(batch.column(name), stats, path) for name in _text_fields(src)]
    levels = batch.column(src.level_field).to_pylist() if src.level_field else None
    where = f"{_where(index, src)}: record {{}} of {path}"
    for i in range(batch.num_rows):
        if src.prompt_field:
            prompt, answer = columns[0][i], columns[1][i]
            if prompt is None:
                raise DataError(f"{where.format(first_record + i)} has no "
                                f"{src.prompt_field!r}; add it or fix "
                                f"data.sources[{index}].prompt_field")
            if not answer or not answer.strip():
                blank = "an empty" if not answer else "a whitespace-only"
                raise DataError(f"{where.format(first_record + i)} has {blank} answer "
                                f"({src.answer_field!r}); give every record an answer or "
                                "drop the record")
            doc = RawDocument(prompt, answer, file=str(path))
        else:
            doc = RawDocument(columns[0][i] or "", file=str(path))
        if levels is not None and not is_blank(doc):
            level = levels[i]
            if level is None or not float(level).is_integer() or level < 0:
                raise DataError(f"{where.format(first_record + i)} has level {level!r} in "
                                f"{src.level_field!r}; levels must be integers >= 0, fix the "
                                f"record or data.sources[{index}].level_field")
            doc = RawDocument(doc.text, doc.answer, int(level), doc.file)
        yield doc


def _parquet_documents(index: int, src: SourceConfig, files: list[Path],
                       stats: SourceStats) -> Iterator[RawDocument]:
    wanted = list(dict.fromkeys(_text_fields(src) + ([src.level_field] if src.level_field
                                                     else [])))
    for path in files:
        pf = _open_parquet(index, src, path)
        _check_parquet_schema(index, src, path, pf)
        batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=wanted)
        record = 1
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{_where(index, src)}: cannot read {path} "
                                f"({_first_line(exc)}); the file is corrupt, replace it") from None
            if batch is None:
                break
            yield from _batch_documents(index, src, path, batch, record, stats)
            record += batch.num_rows


def _jsonl_documents(index: int, src: SourceConfig, files: list[Path],
                     stats: SourceStats) -> Iterator[RawDocument]:
    fields = [pa.field(name, pa.string()) for name in dict.fromkeys(_text_fields(src))]
    if src.level_field:  # float64: 2.5 is read (and refused by name below), not a parse error
        fields.append(pa.field(src.level_field, pa.float64()))
    parse = pj.ParseOptions(explicit_schema=pa.schema(fields), unexpected_field_behavior="ignore")
    read = pj.ReadOptions(block_size=JSON_BLOCK_BYTES)
    for path in files:
        found, record = 0, 1
        try:
            reader = pj.open_json(path, read_options=read, parse_options=parse)
            for batch in reader:
                column = batch.column(_text_fields(src)[0])
                found += len(column) - column.null_count
                yield from _batch_documents(index, src, path, batch, record, stats)
                record += batch.num_rows
        except (pa.ArrowException, OSError) as exc:
            raise DataError(_jsonl_error(index, src, path, exc)) from None
        if not found and path.stat().st_size:
            key = _text_fields(src)[0]
            raise DataError(f"{_where(index, src)}: no line of {path} has the key "
                            f"{key!r}; set data.sources[{index}].{_field_key(src, key)}")


def _jsonl_error(index: int, src: SourceConfig, path: Path, exc: BaseException) -> str:
    """A pyarrow JSON error as one line; a wrongly typed field is named with its fix."""
    detail = _first_line(exc)
    if src.level_field and (f"Column(/{src.level_field})" in detail
                            or "to double" in detail):
        return (f"{_where(index, src)}: key {src.level_field!r} of {path} holds a non-integer "
                f"level ({detail}); levels must be integers >= 0, fix the file or "
                f"data.sources[{index}].level_field")
    for name in _text_fields(src):
        if f"Column(/{name})" in detail:
            return (f"{_where(index, src)}: key {name!r} of {path} does not hold text "
                    f"({detail}); fix the file or data.sources[{index}]."
                    f"{_field_key(src, name)}")
    return (f"{_where(index, src)}: cannot read {path} as JSON lines ({detail}); fix the file "
            f"or data.sources[{index}].{_field_key(src, _text_fields(src)[0])}")


def read_corpus_file(path: Path, where: str = "") -> bytes:
    """The bytes of a corpus file, or a DataError naming it (permissions, an I/O error)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{where}cannot read {path} ({exc.strerror or exc}); make it readable by "
                        "this user (chmod a+r) or remove it from the source") from None


def _file_documents(files: list[Path], stats: SourceStats) -> Iterator[RawDocument]:
    for path in files:
        yield RawDocument(decode_utf8(read_corpus_file(path), stats, path), file=str(path))


def _stdlib_documents(src: SourceConfig, stats: SourceStats) -> Iterator[RawDocument]:
    files = stdlib_files()
    if src.max_docs and src.max_docs < len(files):
        # Evenly spaced over the sorted list: every package, not only the first letters.
        step = len(files) / src.max_docs
        files = [files[int(i * step)] for i in range(src.max_docs)]
    yield from _file_documents(files, stats)


def iter_documents(index: int, src: SourceConfig, stats: SourceStats) -> Iterator[RawDocument]:
    """Stream the documents of ``data.sources[index]`` with text (not blank), ≤ ``max_docs``
    (a labelled source's are :func:`.labelled.iter_labelled_documents`)."""
    assert src.type != "labelled", "labelled sources give tokens and labels, not text"
    if src.type == "reasoning":
        for problem in iter_reasoning_problems(src):
            stats.num_docs += 1
            yield RawDocument(problem.prompt, problem.answer, problem.difficulty)
        return
    if src.type == "stdlib":
        docs: Iterator[RawDocument] = _stdlib_documents(src, stats)
    else:
        files = check_source(index, src)
        if src.type == "parquet":
            docs = _parquet_documents(index, src, files, stats)
        elif src.type == "jsonl":
            docs = _jsonl_documents(index, src, files, stats)
        else:
            docs = _file_documents(files, stats)
    for doc in docs:
        if is_blank(doc):
            stats.note_skipped(doc.file)
            continue
        stats.num_docs += 1
        yield doc
        if src.max_docs and stats.num_docs >= src.max_docs:
            return
