"""Tokenizers: byte ids are the UTF-8 bytes, the fast path equals HF, BPE trains and loads."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.data.tokenizer import (
    TokenEncoder,
    byte_level_tokenizer,
    eos_id,
    load_tokenizer,
    pad_id,
    train_bpe,
)
from pipeline_lib.errors import DataError
from pipeline_lib.spec.names import BYTE_VOCAB_SIZE, EOS_TOKEN

TEXTS = [
    "def f(x):\n\treturn x ** 2  # square\n",
    "naïve café ☃ 😀 — ünïcödé",
    f"literal {EOS_TOKEN} inside text",
    "",
    "   leading spaces and trailing   ",
]


def test_byte_ids_are_utf8_bytes_and_specials_follow():
    tok = byte_level_tokenizer()
    assert tok.get_vocab_size() == BYTE_VOCAB_SIZE == 258
    assert (eos_id(tok), pad_id(tok)) == (256, 257)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == list(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_byte_fast_path_equals_tokenizer():
    tok = byte_level_tokenizer()
    ids, lens = TokenEncoder(tok, byte_level=True).encode_batch(TEXTS)
    expected = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert lens.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for e in expected for i in e]


def test_bpe_trains_encodes_and_round_trips(tmp_path):
    corpus = ["def function(argument):\n    return argument + argument\n"] * 50 + TEXTS
    tok = train_bpe(iter(corpus), vocab_size=300, min_frequency=2)
    assert 258 < tok.get_vocab_size() <= 300
    assert (eos_id(tok), pad_id(tok)) == (0, 1)
    enc = TokenEncoder(tok, byte_level=False)
    ids, lens = enc.encode_batch(TEXTS)
    expected = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert ids.tolist() == [i for e in expected for i in e]
    assert lens.tolist() == [len(e) for e in expected]
    assert len(tok.encode(corpus[0]).ids) < len(corpus[0])  # merges were learned
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path)
    for text in TEXTS:
        ids = loaded.encode(text).ids
        assert ids == tok.encode(text).ids and loaded.decode(ids) == text
        assert eos_id(loaded) not in ids  # a literal <|endoftext|> is text, not EOS


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)


def test_encode_empty_batch():
    ids, lens = TokenEncoder(byte_level_tokenizer(), byte_level=True).encode_batch([])
    assert ids.size == 0 and lens.size == 0 and ids.dtype == np.int64
