"""pack_corpus end to end on tiny corpora: layout, exact coverage, determinism, bad input."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from data_corpus import (
    JSONL_DOCS,
    PARQUET_DOCS,
    QA_RECORDS,
    TEXT_DOCS,
    write_jsonl,
    write_qa_jsonl,
    write_qa_parquet,
    write_text_files,
)

from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.data.reasoning import iter_reasoning_problems
from pipeline_lib.data.tokenizer import load_tokenizer
from pipeline_lib.errors import ConfigError, DataError, PipelineError
from pipeline_lib.spec.config import SourceConfig, TokenizerConfig
from pipeline_lib.spec.config_load import load_config

ROW_LEN = 33  # seq_len 32 in make_data_config


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_tokens(out: Path, meta: dict) -> np.ndarray:
    return np.fromfile(out / "tokens.bin", dtype=meta["token_dtype"])


def split_arrays(out: Path, prefix: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.load(out / prefix / f"{n}.npy") for n in ("doc_start", "doc_len", "row_ptr"))


def coverage(out: Path, prefix: str, total: int) -> np.ndarray:
    """How many times each token of tokens.bin appears in the pieces of a split."""
    starts, lens, _ = split_arrays(out, prefix)
    counts = np.zeros(total, dtype=np.int64)
    for s, n in zip(starts.tolist(), lens.tolist(), strict=True):
        counts[s:s + n] += 1
    return counts


def val_doc_mask(out: Path, meta: dict) -> np.ndarray:
    """Which documents are in val/ (each val piece starts inside exactly one document)."""
    docs = np.load(out / "docs.npy")
    starts, _, _ = split_arrays(out, "val")
    mask = np.zeros(len(docs), dtype=bool)
    mask[np.searchsorted(docs[:, 0], starts, side="right") - 1] = True
    return mask


@pytest.fixture
def packed(tmp_path, mixed_corpus, make_data_config):
    out = tmp_path / "data" / "pack"
    meta = pack_corpus(make_data_config(mixed_corpus), out)
    return out, meta


def test_layout_and_metadata(packed):
    out, meta = packed
    for rel in ["tokenizer.json", "metadata.json", "tokens.bin", "docs.npy", "answer_spans.npy",
                "levels.npy", "train/epoch_0/row_ptr.npy", "train/epoch_1/doc_len.npy", "val/doc_start.npy"]:
        assert (out / rel).is_file(), rel
    assert json.loads((out / "metadata.json").read_text()) == meta
    assert meta["format"] == 1 and meta["layout"] == "document_causal_lm"
    assert (meta["vocab_size"], meta["eos_id"], meta["pad_id"]) == (258, 256, 257)
    assert meta["token_dtype"] == "uint16" and meta["seq_len"] == 32 and meta["row_len"] == 33
    assert meta["num_docs"] == 5 + 3 + 4 + 60  # text (incl. the invalid one), jsonl, parquet
    assert meta["num_train_docs"] + meta["num_val_docs"] == meta["num_docs"]
    assert meta["num_val_docs"] == 7  # round(0.1 × 72)
    assert (out / "tokens.bin").stat().st_size == 2 * meta["total_tokens"]
    assert meta["answer_docs"] == 60
    assert (meta["invalid_utf8_docs"], meta["invalid_utf8_sequences"]) == (1, 2)
    assert [s["num_docs"] for s in meta["sources"]] == [5, 3, 4, 60]
    assert sum(s["num_tokens"] for s in meta["sources"]) == meta["total_tokens"]
    assert meta["tokenizer_sha256"] == sha256(out / "tokenizer.json")
    for rel, digest in meta["arrays"].items():
        assert sha256(out / rel) == digest, rel
    assert len(meta["arrays"]) == 4 + 3 * 2 + 3  # tokens, docs, answer spans, levels; splits
    assert not list(out.parent.glob(".pack*"))  # no temporary directory left


def test_tokens_hold_each_document_then_eos(packed, mixed_corpus):
    out, meta = packed
    tokens = load_tokens(out, meta)
    docs = np.load(out / "docs.npy")
    spans = np.load(out / "answer_spans.npy")
    tok = load_tokenizer(out)
    np.testing.assert_array_equal(docs[1:, 0], np.cumsum(docs[:, 1])[:-1])
    assert (tokens[docs[:, 0] + docs[:, 1] - 1] == 256).all()  # every document ends in EOS
    texts = [tok.decode(tokens[s:s + n - 1].tolist()) for s, n in docs.tolist()]
    invalid = "valid start \ufffd middle \ufffd end"
    assert texts[:12] == TEXT_DOCS + [invalid] + JSONL_DOCS + PARQUET_DOCS
    problems = list(iter_reasoning_problems(mixed_corpus[3]))
    assert texts[12:] == [p.prompt + p.answer for p in problems]
    assert (spans[:12] == 0).all()
    for (start, length), (off, n), p in zip(docs[12:].tolist(), spans[12:].tolist(), problems,
                                            strict=True):
        # The span is the answer and the EOS that ends the document (what answer objectives
        # score: a trained model stops after its answer).
        assert off + n == length and tokens[start + off + n - 1] == 256
        assert tok.decode(tokens[start + off:start + off + n - 1].tolist()) == p.answer
    assert meta["answer_span_version"] == 2


def test_every_training_token_appears_once_per_epoch(packed):
    out, meta = packed
    docs = np.load(out / "docs.npy")
    is_val = val_doc_mask(out, meta)
    assert is_val.sum() == meta["num_val_docs"]
    expected = np.repeat(~is_val, docs[:, 1]).astype(np.int64)
    for epoch in range(meta["num_epochs"]):
        np.testing.assert_array_equal(coverage(out, f"train/epoch_{epoch}", len(expected)),
                                      expected)
    np.testing.assert_array_equal(coverage(out, "val", len(expected)), 1 - expected)


def test_rows_fit_and_only_long_documents_are_split(packed):
    out, meta = packed
    docs = np.load(out / "docs.npy")
    long = docs[:, 1] > ROW_LEN
    assert meta["split_docs"] == int((long & ~val_doc_mask(out, meta)).sum()) >= 1
    for prefix in ["train/epoch_0", "train/epoch_1", "val"]:
        starts, lens, row_ptr = split_arrays(out, prefix)
        assert np.add.reduceat(lens, row_ptr[:-1]).max() <= ROW_LEN
        doc = np.searchsorted(docs[:, 0], starts, side="right") - 1
        pieces = np.bincount(doc, minlength=len(docs))
        present = pieces > 0
        np.testing.assert_array_equal(pieces[present], -(-docs[present, 1] // ROW_LEN))
        whole = present & ~long
        np.testing.assert_array_equal(np.sort(lens[np.isin(doc, np.flatnonzero(whole))]),
                                      np.sort(docs[whole, 1]))
    assert meta["rows_per_epoch"] == len(np.load(out / "train/epoch_1/row_ptr.npy")) - 1
    lens = np.load(out / "train/epoch_0/doc_len.npy")
    assert meta["fill_ratio"] == pytest.approx(lens.sum() / (meta["rows_per_epoch"] * ROW_LEN))


def test_same_config_is_byte_identical_other_seed_reorders(tmp_path, mixed_corpus,
                                                           make_data_config):
    data = make_data_config(mixed_corpus)
    a = pack_corpus(data, tmp_path / "a")
    b = pack_corpus(data, tmp_path / "b")
    assert a["arrays"] == b["arrays"]
    for rel in [*a["arrays"], "tokenizer.json", "metadata.json"]:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    assert a["arrays"]["train/epoch_0/doc_start.npy"] != a["arrays"]["train/epoch_1/doc_start.npy"]
    c = pack_corpus(replace(data, seed=4), tmp_path / "c")
    assert c["arrays"]["tokens.bin"] == a["arrays"]["tokens.bin"]
    assert c["arrays"]["train/epoch_0/doc_start.npy"] != a["arrays"]["train/epoch_0/doc_start.npy"]
    assert c["data_id"] != a["data_id"]


def test_source_weight_repeats_training_documents(tmp_path, make_data_config):
    glob = write_text_files(tmp_path / "t", ["alpha", "beta", "gamma"])
    jsonl = write_jsonl(tmp_path / "d.jsonl", ["one", "two", "three", "four"])
    data = make_data_config([SourceConfig(type="text", path=glob),
                             SourceConfig(type="jsonl", path=jsonl, weight=3.0)], val_fraction=0.0)
    meta = pack_corpus(data, tmp_path / "out")
    docs = np.load(tmp_path / "out" / "docs.npy")
    starts, _, _ = split_arrays(tmp_path / "out", "train/epoch_1")
    copies = np.bincount(np.searchsorted(docs[:, 0], starts, side="right") - 1)
    assert copies.tolist() == [1, 1, 1, 3, 3, 3, 3]
    assert meta["num_train_docs"] == 15 and meta["val_rows"] == 0


def test_bpe_pack_is_deterministic_and_decodes(tmp_path, mixed_corpus, make_data_config):
    data = make_data_config(mixed_corpus, tokenizer=TokenizerConfig(type="bpe", vocab_size=300))
    a = pack_corpus(data, tmp_path / "a")
    b = pack_corpus(data, tmp_path / "b")
    assert a["arrays"] == b["arrays"] and a["tokenizer_sha256"] == b["tokenizer_sha256"]
    assert 258 < a["vocab_size"] <= 300
    tokens = load_tokens(tmp_path / "a", a)
    docs = np.load(tmp_path / "a" / "docs.npy")
    tok = load_tokenizer(tmp_path / "a")
    s, n = docs[0]
    assert tok.decode(tokens[s:s + n - 1].tolist()) == TEXT_DOCS[0]
    assert tokens[s + n - 1] == a["eos_id"] == 0


def test_uint32_tokens_and_repacking_in_place(tmp_path, mixed_corpus, make_data_config):
    out = tmp_path / "out"
    pack_corpus(make_data_config(mixed_corpus), out)
    meta = pack_corpus(make_data_config(mixed_corpus, token_dtype="uint32"), out)
    assert meta["token_dtype"] == "uint32"
    assert (out / "tokens.bin").stat().st_size == 4 * meta["total_tokens"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]


# ---------------------------------------------------------------- bad input


def _corrupt_parquet(tmp: Path) -> list[SourceConfig]:
    (tmp / "bad.parquet").write_bytes(b"PAR1 garbage PAR1")
    return [SourceConfig(type="parquet", path=str(tmp / "*.parquet"))]


def _parquet_without_text(tmp: Path) -> list[SourceConfig]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), tmp / "p.parquet")
    return [SourceConfig(type="parquet", path=str(tmp / "p.parquet"))]


def _empty_corpus(tmp: Path) -> list[SourceConfig]:
    return [SourceConfig(type="text", path=write_text_files(tmp / "t", ["", ""]))]


def _broken_second_file(tmp: Path) -> list[SourceConfig]:
    write_jsonl(tmp / "j" / "a.jsonl", ["fine"] * 5)
    (tmp / "j" / "b.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    return [SourceConfig(type="reasoning", num_docs=20), SourceConfig(type="jsonl",
                                                                      path=str(tmp / "j" / "*"))]


def _qa_source(tmp: Path, records: list[dict], kind: str = "jsonl") -> list[SourceConfig]:
    write = write_qa_jsonl if kind == "jsonl" else write_qa_parquet
    path = write(tmp / f"qa.{kind}", records)
    return [SourceConfig(type="reasoning", num_docs=5),
            SourceConfig(type=kind, path=path, prompt_field="question", answer_field="answer",
                         level_field="hops")]


BAD_INPUTS = {
    "missing path": (lambda t: [SourceConfig(type="text", path=str(t / "nope/*.txt"))], {},
                     DataError, r"data.sources\[0\] .* matches no files"),
    "empty corpus": (_empty_corpus, {}, DataError, "the corpus is empty"),
    "parquet without text column": (_parquet_without_text, {}, DataError, "has no column 'text'"),
    "corrupt parquet": (_corrupt_parquet, {}, DataError, "not a readable Parquet file"),
    "corrupt jsonl found mid-stream": (_broken_second_file, {}, DataError,
                                       r"cannot read .*b.jsonl as JSON lines"),
    "seq_len below 2": (lambda t: [SourceConfig(type="reasoning", num_docs=5)], {"seq_len": 1},
                        ConfigError, r"data.seq_len = 1 is below 2"),
    "vocab too large for dtype": (
        lambda t: [SourceConfig(type="reasoning", num_docs=5)],
        {"token_dtype": "uint16", "tokenizer": TokenizerConfig(type="bpe", vocab_size=70_000)},
        ConfigError, r"vocab_size = 70000 does not fit data.token_dtype = uint16"),
    "jsonl without the prompt key": (
        lambda t: _qa_source(t, [{"prompt": "x", "answer": "1", "hops": 1}]), {}, DataError,
        r"data.sources\[1\] .*first record of .*qa.jsonl has no key 'question'"),
    "parquet without the level column": (
        lambda t: _qa_source(t, [{"question": "x", "answer": "1"}], "parquet"), {}, DataError,
        r"data.sources\[1\] .*qa.parquet has no column 'hops'"),
    "empty answer mid-stream": (
        lambda t: _qa_source(t, [*QA_RECORDS, {"question": "x", "answer": "", "hops": 1}]), {},
        DataError, r"data.sources\[1\] .*record 5 of .*qa.jsonl has an empty answer"),
    "non-integer level": (
        lambda t: _qa_source(t, [*QA_RECORDS, {"question": "x", "answer": "2", "hops": 1.5}]),
        {}, DataError, r"record 5 of .*qa.jsonl has level 1.5 in 'hops'"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_leaves_nothing(case, tmp_path, make_data_config):
    build, overrides, error, pattern = BAD_INPUTS[case]
    sources = build(tmp_path)
    out = tmp_path / "results" / "pack"
    with pytest.raises(error, match=pattern) as err:
        pack_corpus(make_data_config(sources, **overrides), out)
    assert isinstance(err.value, PipelineError) and "\n" not in str(err.value)
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_failed_repack_keeps_the_previous_pack(tmp_path, make_data_config):
    out = tmp_path / "out"
    good = pack_corpus(make_data_config([SourceConfig(type="reasoning", num_docs=20)]), out)
    with pytest.raises(DataError):
        pack_corpus(make_data_config(_broken_second_file(tmp_path)), out)
    assert json.loads((out / "metadata.json").read_text()) == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["j", "out"]


def test_seq_len_below_2_in_a_config_override():
    with pytest.raises(ConfigError, match=r"data.seq_len = 1 is below its minimum 2"):
        load_config(None, ["data.seq_len=1"])


# ---------------------------------------------------------------- levels and users' answers


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_prompt_answer_records_give_answer_spans_and_levels(tmp_path, kind, make_data_config):
    sources = _qa_source(tmp_path, QA_RECORDS, kind)
    out = tmp_path / "out"
    meta = pack_corpus(make_data_config(sources, val_fraction=0.0), out)
    tokens, docs = load_tokens(out, meta), np.load(out / "docs.npy")
    spans, levels = np.load(out / "answer_spans.npy"), np.load(out / "levels.npy")
    tok = load_tokenizer(out)
    problems = list(iter_reasoning_problems(sources[0]))
    assert levels.dtype == np.int64
    assert levels.tolist() == [p.difficulty for p in problems] + [r["hops"] for r in QA_RECORDS]
    assert meta["answer_docs"] == meta["level_docs"] == 5 + 4
    for (start, length), (off, n), r in zip(docs[5:].tolist(), spans[5:].tolist(), QA_RECORDS,
                                             strict=True):
        assert tok.decode(tokens[start:start + length - 1].tolist()) == r["question"] + r["answer"]
        assert off == len(r["question"].encode())  # byte tokenizer: one token per byte
        assert n == len(r["answer"].encode()) + 1 and off + n == length  # answer, EOS
        assert tok.decode(tokens[start + off:start + off + n - 1].tolist()) == r["answer"]
    assert meta["arrays"]["levels.npy"] == sha256(out / "levels.npy")


def test_levels_are_unknown_for_plain_text(packed):
    out, meta = packed
    levels = np.load(out / "levels.npy")
    assert (levels[:12] == -1).all() and (levels[12:] >= 1).all()
    assert meta["level_docs"] == 60 and meta["curriculum"] is None


def _row_levels(out: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """(level of each piece, row of each piece) of a split."""
    docs, levels = np.load(out / "docs.npy"), np.load(out / "levels.npy")
    starts, _, row_ptr = split_arrays(out, prefix)
    doc = np.searchsorted(docs[:, 0], starts, side="right") - 1
    return levels[doc], np.repeat(np.arange(len(row_ptr) - 1), np.diff(row_ptr))


def test_difficulty_curriculum_orders_epoch_0_by_level(tmp_path, make_data_config):
    sources = [SourceConfig(type="reasoning", num_docs=600, min_difficulty=1, max_difficulty=4,
                            seed=2),
               SourceConfig(type="text", path=write_text_files(tmp_path / "t", TEXT_DOCS))]
    plain_cfg = make_data_config(sources, epochs=2)
    cur_cfg = replace(plain_cfg, curriculum_fraction=0.5)
    plain = pack_corpus(plain_cfg, tmp_path / "plain")
    meta = pack_corpus(cur_cfg, tmp_path / "cur")
    out = tmp_path / "cur"
    assert meta["data_id"] != plain["data_id"]
    assert meta["arrays"]["tokens.bin"] == plain["arrays"]["tokens.bin"]

    piece_level, piece_row = _row_levels(out, "train/epoch_0")
    rows = meta["rows_per_epoch"]
    row_level = np.full(rows, -2)
    row_level[piece_row] = piece_level
    # Level-homogeneous rows: every piece of a row has the row's level.
    np.testing.assert_array_equal(piece_level, row_level[piece_row])
    ramp = int(np.ceil(0.5 * rows))
    assert meta["curriculum"]["ramp_rows"] == ramp
    # Largest level allowed at row p < ramp: 1 + floor(3·p / ramp); unknown (text) rows anywhere.
    allowed = 1 + (3 * np.arange(ramp)) // ramp
    assert (row_level[:ramp] <= allowed).all()
    known = row_level[row_level >= 0]
    assert set(known[:10].tolist()) == {1}  # the first rows: the easiest level only
    first = {lv: int(np.argmax(row_level == lv)) for lv in (1, 2, 3, 4)}
    assert first[1] < first[2] < first[3] < first[4] == ramp
    assert meta["curriculum"]["first_row_of_level"] == {str(k): v for k, v in first.items()}
    assert first[2] >= -(-ramp // 3) and first[3] >= -(-2 * ramp // 3)
    cummax = np.maximum.accumulate(np.where(row_level >= 0, row_level, 0))
    assert (np.diff(cummax) >= 0).all() and cummax[ramp - 1] == 3 and cummax[-1] == 4

    # Every document appears exactly as often as without the curriculum, in every epoch.
    total = plain["total_tokens"]
    for epoch in range(2):
        np.testing.assert_array_equal(coverage(out, f"train/epoch_{epoch}", total),
                                      coverage(tmp_path / "plain", f"train/epoch_{epoch}", total))
    np.testing.assert_array_equal(coverage(out, "val", total),
                                  coverage(tmp_path / "plain", "val", total))
    # Epoch 1: level-homogeneous rows in a random order (hard rows early on).
    level_1, row_1 = _row_levels(out, "train/epoch_1")
    early = level_1[row_1 < ramp // 3]
    assert (early == 4).any() and meta["rows_per_epoch"] == len(np.unique(row_1))
