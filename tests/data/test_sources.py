"""Source readers: every format streams its documents; bad input is one clear line."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_corpus import INVALID_UTF8, write_jsonl, write_parquet, write_text_files

from pipeline_lib.config import SourceConfig
from pipeline_lib.data.sources import (
    SourceStats,
    check_source,
    decode_utf8,
    iter_documents,
    stdlib_files,
)
from pipeline_lib.errors import DataError


def read(src: SourceConfig) -> tuple[list[str], SourceStats]:
    stats = SourceStats()
    return [d.text for d in iter_documents(0, src, stats)], stats


def test_text_files_one_document_each_sorted(tmp_path):
    glob = write_text_files(tmp_path / "t", ["first", "", "third"])
    texts, stats = read(SourceConfig(type="text", path=glob))
    assert texts == ["first", "third"]
    assert (stats.num_docs, stats.skipped_empty) == (2, 1)


def test_recursive_glob(tmp_path):
    write_text_files(tmp_path / "a" / "b", ["deep"])
    texts, _ = read(SourceConfig(type="text", path=str(tmp_path / "**" / "*.txt")))
    assert texts == ["deep"]


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    (tmp_path / "bad.txt").write_bytes(INVALID_UTF8)
    texts, stats = read(SourceConfig(type="text", path=str(tmp_path / "*.txt")))
    assert texts == ["valid start \ufffd middle \ufffd end"]
    assert (stats.invalid_utf8_docs, stats.invalid_utf8_sequences) == (1, 2)
    # A genuine U+FFFD in valid text is not an invalid sequence.
    st = SourceStats()
    assert decode_utf8("ok \ufffd".encode() + b"\xff", st) == "ok \ufffd\ufffd"
    assert st.invalid_utf8_sequences == 1


def test_jsonl_reads_the_text_key_and_skips_lines_without_it(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one", "x": 1}\n{"other": "no text"}\n{"text": "two"}\n')
    texts, stats = read(SourceConfig(type="jsonl", path=str(path)))
    assert texts == ["one", "two"] and stats.skipped_empty == 1


def test_jsonl_custom_key_and_max_docs(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["a", "b", "c"], key="content")
    texts, _ = read(SourceConfig(type="jsonl", path=path, text_field="content", max_docs=2))
    assert texts == ["a", "b"]


def test_jsonl_without_the_key_or_malformed(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["a", "b"], key="body")
    with pytest.raises(DataError, match=r"no line of .*d.jsonl has the key 'text'"):
        read(SourceConfig(type="jsonl", path=path))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": broken\n')
    with pytest.raises(DataError, match="cannot read .*bad.jsonl as JSON lines"):
        read(SourceConfig(type="jsonl", path=str(bad)))


def test_parquet_streams_across_row_groups_and_files(tmp_path):
    write_parquet(tmp_path / "p" / "a.parquet", ["a1", "a2", "a3"])
    write_parquet(tmp_path / "p" / "b.parquet", ["b1", None, "b3"])
    texts, stats = read(SourceConfig(type="parquet", path=str(tmp_path / "p" / "*.parquet")))
    assert texts == ["a1", "a2", "a3", "b1", "b3"] and stats.skipped_empty == 1


def test_parquet_binary_column_decodes_with_replacement(tmp_path):
    path = tmp_path / "bin.parquet"
    pq.write_table(pa.table({"text": pa.array([b"fine", INVALID_UTF8], pa.binary())}), path)
    texts, stats = read(SourceConfig(type="parquet", path=str(path)))
    assert texts[0] == "fine" and stats.invalid_utf8_sequences == 2


def test_parquet_without_the_column(tmp_path):
    path = write_parquet(tmp_path / "p.parquet", ["a"], column="body")
    with pytest.raises(DataError) as err:
        check_source(2, SourceConfig(type="parquet", path=path))
    msg = str(err.value)
    assert "data.sources[2]" in msg and "no column 'text'" in msg and "'body'" in msg
    assert "text_field" in msg and "\n" not in msg


def test_parquet_with_a_non_text_column(tmp_path):
    path = tmp_path / "n.parquet"
    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(DataError, match="has type int64, not text"):
        check_source(0, SourceConfig(type="parquet", path=str(path)))


def test_corrupt_parquet(tmp_path):
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"PAR1 this is not a parquet file at all PAR1")
    with pytest.raises(DataError, match=r"broken.parquet is not a readable Parquet file") as err:
        check_source(0, SourceConfig(type="parquet", path=str(path)))
    assert "\n" not in str(err.value)


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(DataError, match=r"data.sources\[1\] .* matches no files"):
        check_source(1, SourceConfig(type="text", path=str(tmp_path / "nope" / "*.txt")))
    with pytest.raises(DataError, match="a directory; use a glob"):
        check_source(0, SourceConfig(type="jsonl", path=str(tmp_path)))


def test_stdlib_is_real_python_without_tests():
    files = stdlib_files()
    names = {f.name for f in files}
    assert {"os.py", "random.py", "__init__.py"} <= names
    assert not any(part in {"test", "site-packages"} for f in files for part in f.parts)
    texts, stats = read(SourceConfig(type="stdlib", max_docs=5))
    assert 1 <= stats.num_docs <= 5 and all("import" in t or "def " in t or '"""' in t
                                              for t in texts)
    # Evenly spaced over the sorted list, not the first five files.
    assert len({t[:200] for t in texts}) == len(texts)


def test_reasoning_documents_carry_answers():
    docs = list(iter_documents(0, SourceConfig(type="reasoning", num_docs=5, tasks=["parity"]),
                               SourceStats()))
    assert len(docs) == 5
    for d in docs:
        assert d.text.startswith("parity(") and d.answer in {"0", "1"}
