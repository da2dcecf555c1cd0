"""pack_corpus with a pretrained tokenizer (data.tokenizer.type: file): exactly the source's
ids plus EOS (and BOS when asked), answer spans after the BOS, large vocabularies, errors
before anything is written, and the data id."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from importlib.metadata import version

import numpy as np
import pytest
from data_corpus import QA_RECORDS, TEXT_DOCS, write_qa_jsonl, write_text_files
from pretrained_tokenizers import trained_bpe, write_hf_directory, write_tokenizer_json
from tokenizers import Tokenizer, models, pre_tokenizers

from pipeline_lib.data.loader import PackedData
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.data.tokenizer import bos_id, eos_id, load_tokenizer, pad_id
from pipeline_lib.errors import ConfigError, DataError
from pipeline_lib.spec.config import DataConfig, SourceConfig, TokenizerConfig
from pipeline_lib.spec.data_id import data_fingerprint, data_id


def file_config(make_data_config, sources, path, **tokenizer):
    return make_data_config(sources, val_fraction=0.0,
                            tokenizer=TokenizerConfig(type="file", path=path, **tokenizer))


def documents(out, meta) -> list[list[int]]:
    tokens = np.fromfile(out / "tokens.bin", dtype=meta["token_dtype"])
    return [tokens[s:s + n].tolist() for s, n in np.load(out / "docs.npy").tolist()]


def encode(text: str) -> list[int]:
    tok = trained_bpe()
    tok.encode_special_tokens = True
    return tok.encode(text, add_special_tokens=False).ids


def test_pack_holds_the_source_ids_then_eos(tmp_path, make_data_config):
    path = write_tokenizer_json(tmp_path / "tok" / "tokenizer.json", trained_bpe())
    sources = [SourceConfig(type="text", path=write_text_files(tmp_path / "t", TEXT_DOCS))]
    out = tmp_path / "out"
    meta = pack_corpus(file_config(make_data_config, sources, path), out)
    assert documents(out, meta) == [encode(t) + [2] for t in TEXT_DOCS]
    assert (meta["vocab_size"], meta["eos_id"], meta["pad_id"], meta["bos_id"]) == (320, 2, 2, None)
    assert meta["token_dtype"] == "uint16"
    src = meta["tokenizer_source"]
    assert (src["path"], src["kind"], src["eos_id"], src["bos_id"]) == (path, "tokenizer.json", 2,
                                                                        None)
    assert meta["tokenizer"]["type"] == "file"
    tok = load_tokenizer(out)  # what the trainer copies into every snapshot
    assert tok.get_vocab() == trained_bpe().get_vocab()
    assert (eos_id(tok), pad_id(tok), bos_id(tok)) == (2, 2, None)


def test_bos_starts_every_document_and_answer_spans_follow_it(tmp_path, make_data_config):
    path = write_hf_directory(tmp_path / "hf", trained_bpe(), bos_token="<s>", eos_token="</s>",
                              add_bos_token=True)
    sources = [SourceConfig(type="jsonl", path=write_qa_jsonl(tmp_path / "qa.jsonl", QA_RECORDS),
                            prompt_field="question", answer_field="answer", level_field="hops")]
    out = tmp_path / "out"
    meta = pack_corpus(file_config(make_data_config, sources, path, add_bos="auto"), out)
    docs = documents(out, meta)
    assert docs == [[1] + encode(r["question"]) + encode(r["answer"]) + [2] for r in QA_RECORDS]
    spans = np.load(out / "answer_spans.npy").tolist()
    # after the BOS and the question: the answer and the EOS that ends it
    assert spans == [[1 + len(encode(r["question"])), len(encode(r["answer"])) + 1]
                     for r in QA_RECORDS]
    assert meta["bos_id"] == 1 == bos_id(load_tokenizer(out))
    data = PackedData(out)
    rows = data.rows(0, np.arange(data.rows_per_epoch))
    scored = rows["targets"][rows["answer_mask"]]
    assert sorted(scored.tolist()) == sorted(i for r in QA_RECORDS
                                             for i in [*encode(r["answer"]), 2])
    assert not (rows["targets"] == 1).any()  # a BOS is never predicted across documents
    assert (rows["input_ids"] == 1).sum() == len(QA_RECORDS)

    plain = pack_corpus(file_config(make_data_config, sources, path, add_bos="false"),
                        tmp_path / "plain")
    assert documents(tmp_path / "plain", plain) == [d[1:] for d in docs]
    assert plain["bos_id"] is None and bos_id(load_tokenizer(tmp_path / "plain")) is None


def wide_tokenizer(n_words: int) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n_words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def test_a_vocabulary_past_65536_ids_packs_as_uint32(tmp_path, make_data_config):
    path = write_tokenizer_json(tmp_path / "tokenizer.json", wide_tokenizer(70_000))
    texts = ["w69999 w5 w65536", "w65535 w0"]
    sources = [SourceConfig(type="text", path=write_text_files(tmp_path / "t", texts))]
    out = tmp_path / "out"
    meta = pack_corpus(file_config(make_data_config, sources, path), out)
    assert (meta["token_dtype"], meta["vocab_size"], meta["eos_id"]) == ("uint32", 70_001, 70_000)
    assert documents(out, meta) == [[69999, 5, 65536, 70_000], [65535, 0, 70_000]]
    narrow = replace(file_config(make_data_config, sources, path), token_dtype="uint16")
    with pytest.raises(ConfigError, match="70001 ids, more than data.token_dtype = uint16"):
        pack_corpus(narrow, tmp_path / "narrow")
    assert not (tmp_path / "narrow").exists()


def test_unusable_tokenizers_fail_before_anything_is_written(tmp_path, make_data_config):
    sources = [SourceConfig(type="text", path=write_text_files(tmp_path / "t", TEXT_DOCS))]
    for path, message in [(str(tmp_path / "missing.json"), "does not exist"),
                          (str(tmp_path / "t"), "directory without tokenizer.json")]:
        with pytest.raises(DataError, match=message):
            pack_corpus(file_config(make_data_config, sources, path), tmp_path / "out")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_data_id_follows_the_tokenizer_file(tmp_path, make_data_config):
    path = write_tokenizer_json(tmp_path / "tokenizer.json", trained_bpe())
    sources = [SourceConfig(type="reasoning", num_docs=50, seed=3)]
    cfg = file_config(make_data_config, sources, path)
    first = data_id(cfg)
    assert re.fullmatch(r"[0-9a-f]{12}", first) and data_id(cfg) == first
    fp = data_fingerprint(cfg)["tokenizer"]
    assert (fp["type"], fp["add_bos"], fp["tokenizers"]) == ("file", "auto", version("tokenizers"))
    assert data_id(replace(cfg, tokenizer=replace(cfg.tokenizer, add_bos="false"))) != first
    os.utime(path, ns=(1, 1_000_000_000))
    second = data_id(cfg)
    write_tokenizer_json(tmp_path / "tokenizer.json", trained_bpe(vocab_size=300))
    assert len({first, second, data_id(cfg)}) == 3
    missing = replace(cfg, tokenizer=replace(cfg.tokenizer, path=str(tmp_path / "none.json")))
    assert re.fullmatch(r"[0-9a-f]{12}", data_id(missing))  # the pack reports it


def test_byte_and_bpe_data_ids_are_unchanged():
    sources = [SourceConfig(type="reasoning", num_docs=50, seed=3)]
    # as before file tokenizers, but for the answer span version (2: spans end with the EOS)
    assert data_id(DataConfig(sources=sources)) == "a1c837c124cb"
    bpe = DataConfig(sources=sources, tokenizer=TokenizerConfig(type="bpe", vocab_size=512))
    assert data_fingerprint(bpe)["tokenizer"] == {
        "type": "bpe", "vocab_size": 512, "min_frequency": 2, "tokenizers": version("tokenizers")}
    if version("tokenizers") == "0.23.3":  # the pinned release the id was recorded with
        assert data_id(bpe) == "b137325773a3"


@pytest.mark.slow
def test_pack_with_the_smollm2_gguf_tokenizer(tmp_path, make_data_config):
    from transformers import AutoTokenizer

    from pipeline_lib.data.tokenizer_files import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    sources = [SourceConfig(type="text", path=write_text_files(tmp_path / "t", TEXT_DOCS))]
    out = tmp_path / "out"
    meta = pack_corpus(file_config(make_data_config, sources, str(gguf)), out)
    hf = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert documents(out, meta) == [hf.encode(t, add_special_tokens=False) + [0]
                                    for t in TEXT_DOCS]
    assert (meta["vocab_size"], meta["eos_id"], meta["pad_id"], meta["bos_id"]) == (49152, 0, 0,
                                                                                    None)
    assert meta["tokenizer_source"]["kind"] == "gguf" and meta["token_dtype"] == "uint16"
    with_bos = pack_corpus(file_config(make_data_config, sources, str(gguf), add_bos="true"),
                           tmp_path / "bos")
    assert [d[0] for d in documents(tmp_path / "bos", with_bos)] == [1] * len(TEXT_DOCS)
    assert json.loads((tmp_path / "bos" / "metadata.json").read_text())["bos_id"] == 1
