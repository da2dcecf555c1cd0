"""Pretrained tokenizers: tokenizer.json, HF directories and GGUF files read with their
vocabulary unchanged, special ids found from the file alone, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pretrained_tokenizers import (
    SAMPLE_TEXTS,
    trained_bpe,
    write_gguf,
    write_hf_directory,
    write_tokenizer_json,
)
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from pipeline_lib.data.gguf_metadata import GGUFArray, read_gguf_metadata
from pipeline_lib.data.tokenizer import bos_id, eos_id, pad_id
from pipeline_lib.data.tokenizer_files import smollm2_gguf_path, source_vocab_size
from pipeline_lib.data.tokenizer_source import tokenizer_from_source
from pipeline_lib.errors import DataError
from pipeline_lib.spec.tokenizer_id import tokenizer_source_fingerprint


def reference(tok: Tokenizer) -> Tokenizer:
    """``tok`` as loopline encodes documents: special-token strings in text are text."""
    tok.encode_special_tokens = True
    return tok


def word_tokenizer(words: list[str], specials: list[str], plain: list[str] = ()) -> Tokenizer:
    """Whitespace WordLevel: ``words`` get ids 0…, then ``specials`` (special) and ``plain``
    (added, not special)."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    tok.add_tokens([AddedToken(t, special=False) for t in plain])
    return tok


def test_tokenizer_json_keeps_its_ids_and_vocabulary(tmp_path):
    original = trained_bpe()
    path = write_tokenizer_json(tmp_path / "tok" / "tokenizer.json", original)
    tok, info = tokenizer_from_source(path)
    ref = reference(trained_bpe())
    for text in SAMPLE_TEXTS:
        assert tok.encode(text).ids == ref.encode(text, add_special_tokens=False).ids
    assert tok.get_vocab() == original.get_vocab()
    assert (info.kind, info.vocab_size, info.eos_id, info.pad_id) == ("tokenizer.json", 320, 2, 2)
    assert info.bos_id is None and not info.add_bos and info.source_bos_id is None
    assert source_vocab_size(path) == 320
    assert info.fingerprint == tokenizer_source_fingerprint(path)


def test_special_ids_follow_the_name_ladders():
    tok = word_tokenizer(["a", "b"], ["</s>", "<|endoftext|>"])
    assert (eos_id(tok), pad_id(tok)) == (3, 3)  # <|endoftext|> outranks </s>; pad falls back
    tok = word_tokenizer(["a", "b"], ["<eos>", "<pad>"])
    assert (eos_id(tok), pad_id(tok)) == (2, 3)
    tok = word_tokenizer(["a", "b"], ["<pad>"], plain=["</s>"])  # </s> not special: no EOS
    with pytest.raises(DataError, match="none of the end-of-document tokens"):
        eos_id(tok)


def test_no_end_of_document_token_is_an_error_naming_the_file(tmp_path):
    path = write_tokenizer_json(tmp_path / "t.json", word_tokenizer(["a", "b"], ["<|im_end|>"]))
    with pytest.raises(DataError, match=r"tokenizer .*t\.json has none of the end-of-document"):
        tokenizer_from_source(path)


def test_hf_directory_bos_from_post_processor_config_and_setting(tmp_path):
    plain = write_hf_directory(tmp_path / "plain", trained_bpe(), eos_token="</s>")
    tok, info = tokenizer_from_source(plain)
    assert (info.kind, info.bos_id, info.source_eos_id, info.eos_id) == ("hf_directory", None, 2, 2)
    assert bos_id(tok) is None
    # transformers writes the BOS it adds into tokenizer.json's post-processor
    with_bos = write_hf_directory(tmp_path / "bos", trained_bpe(), bos_token="<s>",
                                  eos_token="</s>", add_bos_token=True)
    tok, info = tokenizer_from_source(with_bos)
    assert (info.bos_id, info.source_bos_id, info.source_add_bos) == (1, 1, True)
    ref = reference(trained_bpe())
    for text in SAMPLE_TEXTS:
        assert tok.encode(text).ids == [1] + ref.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False).ids == ref.encode(
            text, add_special_tokens=False).ids
    assert tokenizer_from_source(with_bos, "false")[1].bos_id is None
    # an explicit add_bos_token in tokenizer_config.json wins over the post-processor
    off = write_hf_directory(tmp_path / "off", trained_bpe(), {"add_bos_token": False},
                             bos_token="<s>", eos_token="</s>", add_bos_token=True)
    tok, info = tokenizer_from_source(off)
    assert (info.bos_id, info.source_bos_id) == (None, 1) and bos_id(tok) is None
    # no bos_token in the tokenizer files: config.json's bos_token_id
    ids = write_hf_directory(tmp_path / "ids", trained_bpe(), {"add_bos_token": True},
                             {"bos_token_id": 0, "eos_token_id": [2, 1]})
    tok, info = tokenizer_from_source(ids)
    assert (info.bos_id, info.source_eos_id) == (0, 2) and tok.encode("the").ids[0] == 0


def test_add_bos_true_without_a_bos_is_an_error(tmp_path):
    path = write_tokenizer_json(tmp_path / "tokenizer.json", trained_bpe())
    with pytest.raises(DataError, match="declares no BOS token.*add_bos to false"):
        tokenizer_from_source(path, "true")


def test_stored_truncation_and_padding_are_switched_off(tmp_path):
    tok = trained_bpe()
    tok.enable_truncation(4)
    tok.enable_padding(length=64, pad_id=0, pad_token="<unk>")
    path = write_tokenizer_json(tmp_path / "tokenizer.json", tok)
    loaded, _ = tokenizer_from_source(path)
    text = SAMPLE_TEXTS[2]
    assert loaded.encode(text).ids == reference(trained_bpe()).encode(
        text, add_special_tokens=False).ids
    assert loaded.truncation is None and loaded.padding is None


def test_vocabulary_size_is_highest_id_plus_one(tmp_path):
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 5}, unk_token="a"))  # ids 1, 3, 4 unused
    tok.add_special_tokens(["</s>"])  # id 2
    assert tok.get_vocab_size() == 3  # distinct tokens, not the embedding rows id 5 needs
    path = write_tokenizer_json(tmp_path / "tokenizer.json", tok)
    assert tokenizer_from_source(path)[1].vocab_size == source_vocab_size(path) == 6


def test_missing_and_unusable_sources_are_one_line_errors(tmp_path):
    cases = {
        str(tmp_path / "nope.json"): "data.tokenizer.path .*nope.json does not exist",
        str(tmp_path): "is a directory without tokenizer.json",
    }
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all")
    cases[str(tmp_path / "junk.gguf")] = "is not a GGUF file"
    cases[write_gguf(tmp_path / "empty.gguf", None)] = "GGUF file .*empty.gguf holds no tokenizer"
    (tmp_path / "bad.json").write_text("{not json")
    cases[str(tmp_path / "bad.json")] = "bad.json is not a valid tokenizer.json"
    for path, message in cases.items():
        with pytest.raises(DataError, match=message) as info:
            tokenizer_from_source(path)
        assert "\n" not in str(info.value)
    for path in list(cases)[:4]:
        with pytest.raises(DataError):
            source_vocab_size(path)


def test_gguf_metadata_matches_the_gguf_reader(tmp_path):
    import gguf

    path = write_gguf(tmp_path / "tok.gguf", trained_bpe(), add_bos=True)
    meta = read_gguf_metadata(tmp_path / "tok.gguf")
    fields = gguf.GGUFReader(path).fields
    assert set(meta) == {k for k in fields if not k.startswith("GGUF.")}
    for key, field in fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert meta[key] == GGUFArray(int(field.types[1]), len(field.data)), key
        else:
            assert meta[key] == field.contents(), key
    assert meta["tokenizer.ggml.tokens"].length == source_vocab_size(path) == 320


def test_vocabulary_size_imports_nothing_heavy(tmp_path):
    json_path = write_tokenizer_json(tmp_path / "tokenizer.json", trained_bpe())
    gguf_path = write_gguf(tmp_path / "tok.gguf", trained_bpe())
    code = ("import sys; from pipeline_lib.data.tokenizer_files import source_vocab_size; "
            f"print(source_vocab_size({json_path!r}), source_vocab_size({gguf_path!r})); "
            "print(sorted({'torch', 'tokenizers', 'transformers'} & {m.split('.')[0] "
            "for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ})
    assert out.stdout.split("\n")[:2] == ["320 320", "[]"]


@pytest.mark.slow
def test_gguf_tokenizer_is_rebuilt_with_the_same_ids(tmp_path):
    """transformers rebuilds the BPE from the GGUF's tokens and merges; the GPT-2 default
    <|endoftext|> it adds past the vocabulary is dropped."""
    path = write_gguf(tmp_path / "tok.gguf", trained_bpe(), add_bos=True)
    tok, info = tokenizer_from_source(path)
    ref = reference(trained_bpe())
    for text in SAMPLE_TEXTS:
        assert tok.encode(text, add_special_tokens=False).ids == ref.encode(
            text, add_special_tokens=False).ids
    assert tok.get_vocab() == ref.get_vocab()
    assert (info.kind, info.vocab_size, info.eos_id, info.bos_id) == ("gguf", 320, 2, 1)
    assert tokenizer_from_source(path, "false")[1].bos_id is None


@pytest.mark.slow
def test_smollm2_gguf_tokenizer_matches_transformers():
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    tok, info = tokenizer_from_source(path)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    texts = SAMPLE_TEXTS[:3] + ["Hello world!  The capital of France is Paris.\n\n",
                                "for i in range(10):\n    print(i ** 2)\n", "数学 ünïcödé"]
    for text in texts:
        assert tok.encode(text, add_special_tokens=False).ids == hf.encode(
            text, add_special_tokens=False)
        assert tok.encode(text).ids == hf.encode(text)  # neither adds a BOS (add_bos_token off)
        assert tok.decode(tok.encode(text).ids) == text
    assert info.vocab_size == len(hf) == 49152 == source_vocab_size(str(path))
    assert tok.id_to_token(info.eos_id) == "<|endoftext|>" and info.eos_id == 0 == info.pad_id
    assert (info.bos_id, info.source_bos_id, info.source_eos_id) == (None, 1, 2)
    assert json.loads(tok.to_str())["post_processor"] is None
