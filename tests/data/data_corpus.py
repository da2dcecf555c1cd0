"""Tiny corpora written into tmp_path for the data-stage tests (imported by conftest and tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

TEXT_DOCS = [
    "def add(a, b):\n    return a + b\n",
    "short",
    "x" * 150,  # longer than a 33-token row: split into pieces
    "naïve café ☃ — unicode text spans several bytes per character\n",
]
JSONL_DOCS = ["the quick brown fox jumps over the lazy dog", "a" * 70, "jsonl third doc"]
PARQUET_DOCS = ["import os\nprint(os.getcwd())\n", "b" * 40, "parquet three", "z"]
# Bytes 0xff and 0xfe are never valid UTF-8: two invalid sequences in one document.
INVALID_UTF8 = b"valid start \xff middle \xfe end"


def write_text_files(root: Path, docs: list[str]) -> str:
    root.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(docs):
        (root / f"doc_{i:03d}.txt").write_text(text, encoding="utf-8")
    return str(root / "*.txt")


def write_jsonl(path: Path, docs: list[str], key: str = "text") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({key: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return str(path)


def write_parquet(path: Path, docs: list[str], column: str = "text") -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: docs, "n": list(range(len(docs)))})
    pq.write_table(table, path, row_group_size=2)
    return str(path)


# Pointer-chasing records with a prompt, an answer and a hop count (the level).
QA_RECORDS = [
    {"question": "a=3;b=a;print(b)=", "answer": "3", "hops": 1},
    {"question": "x=7;y=x;z=y;print(z)=", "answer": "7", "hops": 2},
    {"question": "p=1;q=p;r=q;s=r;print(s)=", "answer": "1", "hops": 3},
    {"question": "", "answer": "42", "hops": 0},  # an empty prompt is allowed
]


def write_qa_jsonl(path: Path, records: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def write_qa_parquet(path: Path, records: list[dict], **types: pa.DataType) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    names = list(records[0])
    table = pa.table({n: pa.array([r.get(n) for r in records], type=types.get(n))
                      for n in names})
    pq.write_table(table, path, row_group_size=2)
    return str(path)
