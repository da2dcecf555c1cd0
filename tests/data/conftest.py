"""Fixtures for the data-stage tests: a tiny mixed corpus and DataConfig builders."""

from __future__ import annotations

from pathlib import Path

import pytest
from data_corpus import (
    INVALID_UTF8,
    JSONL_DOCS,
    PARQUET_DOCS,
    TEXT_DOCS,
    write_jsonl,
    write_parquet,
    write_text_files,
)

from pipeline_lib.spec.config import DataConfig, SourceConfig


@pytest.fixture
def mixed_corpus(tmp_path: Path) -> list[SourceConfig]:
    """Text files (one with invalid UTF-8), a JSONL file, a Parquet file and reasoning."""
    text_glob = write_text_files(tmp_path / "corpus" / "text", TEXT_DOCS)
    (tmp_path / "corpus" / "text" / "zz_invalid.txt").write_bytes(INVALID_UTF8)
    return [
        SourceConfig(type="text", path=text_glob),
        SourceConfig(type="jsonl", path=write_jsonl(tmp_path / "corpus" / "a.jsonl", JSONL_DOCS)),
        SourceConfig(type="parquet",
                     path=write_parquet(tmp_path / "corpus" / "p.parquet", PARQUET_DOCS)),
        SourceConfig(type="reasoning", num_docs=60, max_difficulty=3, seed=5),
    ]


@pytest.fixture
def make_data_config():
    """DataConfig with small defaults: seq_len 32, two epochs, 10% validation."""

    def build(sources: list[SourceConfig], **overrides) -> DataConfig:
        kwargs = dict(sources=sources, seq_len=32, epochs=2, val_fraction=0.1, seed=3)
        kwargs.update(overrides)
        return DataConfig(**kwargs)

    return build
