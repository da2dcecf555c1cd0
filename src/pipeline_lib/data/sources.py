"""Corpus sources streamed in bounded memory: parquet, jsonl, text files, stdlib, reasoning.

Every source yields :class:`RawDocument` values one at a time; parquet and jsonl are read
through pyarrow in record batches, so memory is bounded by a batch, not by the file.
Problems a user can cause (a glob that matches nothing, a missing column, a corrupt file)
raise :class:`~pipeline_lib.errors.DataError` naming ``data.sources[i]`` and the file.
Invalid UTF-8 is decoded with replacement characters and counted, never fatal.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..config import SourceConfig
from ..errors import DataError
from .identity import FILE_SOURCE_TYPES, source_files, stdlib_dir
from .reasoning import iter_reasoning_problems

BATCH_ROWS = 512  # rows per pyarrow record batch: bounds memory for large files
JSON_BLOCK_BYTES = 16 << 20  # one JSON line must fit in a block
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass(frozen=True)
class RawDocument:
    """One document: ``text``, then ``answer`` (reasoning only) whose tokens are recorded."""

    text: str
    answer: str = ""


@dataclass
class SourceStats:
    """Counts gathered while a source is read (reported in metadata.json)."""

    num_docs: int = 0
    skipped_empty: int = 0
    invalid_utf8_docs: int = 0
    invalid_utf8_sequences: int = 0


def decode_utf8(raw: bytes, stats: SourceStats) -> str:
    """Decode UTF-8; invalid sequences become U+FFFD and are counted in ``stats``."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("utf-8", errors="replace")
        stats.invalid_utf8_docs += 1
        stats.invalid_utf8_sequences += text.count("\ufffd") - raw.count("\ufffd".encode())
        return text


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


def check_source(index: int, src: SourceConfig) -> list[Path]:
    """Fail early, before any output exists: files present, parquet readable with the column."""
    if src.type not in FILE_SOURCE_TYPES:
        return []
    files = source_files(src)
    if not files:
        hint = "a directory; use a glob such as DIR/*" if os.path.isdir(src.path) else "no files"
        raise DataError(f"{_where(index, src)} matches {hint}; point data.sources[{index}].path "
                        "at existing files")
    if src.type == "parquet":
        for path in files:
            _check_parquet_schema(index, src, path, _open_parquet(index, src, path))
    return files


def _open_parquet(index: int, src: SourceConfig, path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{_where(index, src)}: {path} is not a readable Parquet file "
                        f"({_first_line(exc)}); replace or remove it") from None


def _check_parquet_schema(index: int, src: SourceConfig, path: Path, pf) -> None:
    import pyarrow as pa

    schema = pf.schema_arrow
    if src.text_field not in schema.names:
        raise DataError(f"{_where(index, src)}: {path} has no column {src.text_field!r} "
                        f"(columns: {schema.names}); set data.sources[{index}].text_field")
    kind = schema.field(src.text_field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise DataError(f"{_where(index, src)}: column {src.text_field!r} of {path} has type "
                        f"{kind}, not text; set data.sources[{index}].text_field to a string "
                        "column")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _column_texts(column, stats: SourceStats) -> Iterator[str | None]:
    import pyarrow as pa

    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        for raw in column.to_pylist():
            yield None if raw is None else decode_utf8(raw, stats)
    else:
        yield from column.to_pylist()


def _parquet_texts(index: int, src: SourceConfig, files: list[Path],
                   stats: SourceStats) -> Iterator[str | None]:
    import pyarrow as pa

    for path in files:
        pf = _open_parquet(index, src, path)
        _check_parquet_schema(index, src, path, pf)
        batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=[src.text_field])
        while True:
            try:
                batch = next(batches, None)
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{_where(index, src)}: cannot read {path} "
                                f"({_first_line(exc)}); the file is corrupt, replace it") from None
            if batch is None:
                break
            yield from _column_texts(batch.column(0), stats)


def _jsonl_texts(index: int, src: SourceConfig, files: list[Path],
                 stats: SourceStats) -> Iterator[str | None]:
    import pyarrow as pa
    import pyarrow.json as pj

    schema = pa.schema([pa.field(src.text_field, pa.string())])
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    read = pj.ReadOptions(block_size=JSON_BLOCK_BYTES)
    for path in files:
        found = 0
        try:
            reader = pj.open_json(path, read_options=read, parse_options=parse)
            for batch in reader:
                column = batch.column(0)
                found += len(column) - column.null_count
                yield from column.to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{_where(index, src)}: cannot read {path} as JSON lines "
                            f"({_first_line(exc)}); fix the file or data.sources[{index}]."
                            "text_field") from None
        if not found and path.stat().st_size:
            raise DataError(f"{_where(index, src)}: no line of {path} has the key "
                            f"{src.text_field!r}; set data.sources[{index}].text_field")


def _file_texts(files: list[Path], stats: SourceStats) -> Iterator[str]:
    for path in files:
        yield decode_utf8(path.read_bytes(), stats)


def _stdlib_texts(src: SourceConfig, stats: SourceStats) -> Iterator[str]:
    files = stdlib_files()
    if src.max_docs and src.max_docs < len(files):
        # Evenly spaced over the sorted list: every package, not only the first letters.
        step = len(files) / src.max_docs
        files = [files[int(i * step)] for i in range(src.max_docs)]
    yield from _file_texts(files, stats)


def iter_documents(index: int, src: SourceConfig, stats: SourceStats) -> Iterator[RawDocument]:
    """Stream the non-empty documents of ``data.sources[index]``, at most ``max_docs``."""
    if src.type == "reasoning":
        for problem in iter_reasoning_problems(src):
            stats.num_docs += 1
            yield RawDocument(problem.prompt, problem.answer)
        return
    if src.type == "stdlib":
        texts: Iterator[str | None] = _stdlib_texts(src, stats)
    else:
        files = check_source(index, src)
        if src.type == "parquet":
            texts = _parquet_texts(index, src, files, stats)
        elif src.type == "jsonl":
            texts = _jsonl_texts(index, src, files, stats)
        else:
            texts = _file_texts(files, stats)
    for text in texts:
        if not text:
            stats.skipped_empty += 1
            continue
        stats.num_docs += 1
        yield RawDocument(text)
        if src.max_docs and stats.num_docs >= src.max_docs:
            return
