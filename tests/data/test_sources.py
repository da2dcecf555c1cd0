"""Source readers: every format streams its documents; bad input is one clear line."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_corpus import (
    INVALID_UTF8,
    QA_RECORDS,
    write_jsonl,
    write_parquet,
    write_qa_jsonl,
    write_qa_parquet,
    write_text_files,
)

from pipeline_lib.data.reasoning import iter_reasoning_problems
from pipeline_lib.data.sources import (
    SourceStats,
    check_source,
    decode_utf8,
    iter_documents,
    stdlib_files,
)
from pipeline_lib.errors import DataError
from pipeline_lib.spec.config import SourceConfig


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
    problems = iter_reasoning_problems(SourceConfig(type="reasoning", num_docs=5,
                                                    tasks=["parity"]))
    assert [d.level for d in docs] == [p.difficulty for p in problems]  # the level is k


# ---------------------------------------------------------------- prompt / answer / level fields

QA = dict(prompt_field="question", answer_field="answer", level_field="hops")


def _qa_docs(src: SourceConfig) -> list[tuple[str, str, int]]:
    return [(d.text, d.answer, d.level) for d in iter_documents(0, src, SourceStats())]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_prompt_answer_and_level_fields(tmp_path, kind):
    write = write_qa_jsonl if kind == "jsonl" else write_qa_parquet
    path = write(tmp_path / f"qa.{kind}", QA_RECORDS)
    expected = [(r["question"], r["answer"], r["hops"]) for r in QA_RECORDS]
    assert _qa_docs(SourceConfig(type=kind, path=path, **QA)) == expected
    # Without a level field the level is unknown; text mode can carry a level too.
    no_level = SourceConfig(type=kind, path=path, prompt_field="question", answer_field="answer")
    assert [lv for _, _, lv in _qa_docs(no_level)] == [-1] * 4
    text_mode = SourceConfig(type=kind, path=path, text_field="question", level_field="hops",
                             max_docs=2)
    assert _qa_docs(text_mode) == [(r["question"], "", r["hops"]) for r in QA_RECORDS[:2]]


QA_ERRORS = {
    "jsonl prompt key missing": (
        "jsonl", [{"q": "x", "answer": "1", "hops": 1}], {},
        r"the first record of .*bad.jsonl has no key 'question' .*set data.sources\[0\]"
        r".prompt_field"),
    "jsonl level key missing later": (
        "jsonl", [QA_RECORDS[0], {"question": "x", "answer": "1"}], {},
        r"record 2 of .*bad.jsonl has level None in 'hops'; levels must be integers >= 0"),
    "jsonl empty answer": (
        "jsonl", [QA_RECORDS[0], {"question": "x", "answer": "", "hops": 1}], {},
        r"record 2 of .*bad.jsonl has an empty answer \('answer'\)"),
    "jsonl null answer": (
        "jsonl", [{"question": "x", "answer": None, "hops": 1}], {},
        r"record 1 of .*bad.jsonl has an empty answer"),
    "jsonl fractional level": (
        "jsonl", [QA_RECORDS[0], {"question": "x", "answer": "1", "hops": 2.5}], {},
        r"record 2 of .*bad.jsonl has level 2.5 in 'hops'; levels must be integers >= 0"),
    "jsonl negative level": (
        "jsonl", [{"question": "x", "answer": "1", "hops": -2}], {},
        r"record 1 of .*bad.jsonl has level -2.0 in 'hops'"),
    "jsonl text level": (
        "jsonl", [QA_RECORDS[0], {"question": "x", "answer": "1", "hops": "hard"}], {},
        r"key 'hops' of .*bad.jsonl holds a non-integer level .*data.sources\[0\].level_field"),
    "parquet answer column missing": (
        "parquet", [{"question": "x", "hops": 1}], {},
        r"bad.parquet has no column 'answer' .*set data.sources\[0\].answer_field"),
    "parquet float level column": (
        "parquet", [{"question": "x", "answer": "1", "hops": 1.0}], {},
        r"level column 'hops' of .*bad.parquet has type double, not an integer"),
    "parquet null level": (
        "parquet", [QA_RECORDS[0], {"question": "x", "answer": "1", "hops": None}],
        {"hops": pa.int64()}, r"record 2 of .*bad.parquet has level None in 'hops'"),
    "parquet empty answer": (
        "parquet", [QA_RECORDS[0], QA_RECORDS[1], {"question": "x", "answer": "", "hops": 1}],
        {}, r"record 3 of .*bad.parquet has an empty answer"),
}


@pytest.mark.parametrize("case", list(QA_ERRORS))
def test_prompt_answer_level_errors_are_one_line(tmp_path, case):
    kind, records, types, pattern = QA_ERRORS[case]
    path = (write_qa_jsonl(tmp_path / "bad.jsonl", records) if kind == "jsonl"
            else write_qa_parquet(tmp_path / "bad.parquet", records, **types))
    with pytest.raises(DataError, match=pattern) as err:
        _qa_docs(SourceConfig(type=kind, path=path, **QA))
    assert "\n" not in str(err.value) and "data.sources[0]" in str(err.value)
