"""Tiny "pretrained" tokenizers written into tmp_path: a tokenizer.json, a Hugging Face
directory, a GGUF file (imported by the file-tokenizer tests)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

TRAIN_TEXTS = ["the quick brown fox jumps over the lazy dog", "def f(x):\n    return x + 1\n",
               "naïve café ☃ unicode", "a=3;b=a;print(b)=3"] * 20
SAMPLE_TEXTS = ["the quick brown fox", "def g(y):\n\treturn y * 2  # twice\n",
                "naïve café ☃ 😀 unseen words zebra", "literal </s> and <s> are text",
                "   leading spaces"]


def trained_bpe(specials: tuple[str, ...] = ("<unk>", "<s>", "</s>"),
                vocab_size: int = 320) -> Tokenizer:
    """Byte-level BPE (GPT-2 style) trained on TRAIN_TEXTS; ``specials`` get ids 0, 1, …"""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAIN_TEXTS, trainer=trainer)
    return tok


def write_tokenizer_json(path: Path, tok: Tokenizer) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return str(path)


def write_hf_directory(path: Path, tok: Tokenizer, tokenizer_config: dict | None = None,
                       model_config: dict | None = None, **special_tokens: str) -> str:
    """``PreTrainedTokenizerFast.save_pretrained`` (transformers writes a BOS it adds into the
    tokenizer.json's post-processor), then ``tokenizer_config`` keys merged into its
    tokenizer_config.json and ``model_config`` written as config.json."""
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_object=tok, **special_tokens).save_pretrained(str(path))
    if tokenizer_config:
        cfg_path = path / "tokenizer_config.json"
        cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **tokenizer_config}))
    if model_config:
        (path / "config.json").write_text(json.dumps(model_config))
    return str(path)


def write_gguf(path: Path, tok: Tokenizer | None, bos: str | None = "<s>", eos: str = "</s>",
               add_bos: bool | None = None) -> str:
    """A GGUF with no tensors holding ``tok`` (a byte-level BPE) as llama.cpp stores a GPT-2
    style tokenizer: tokens by id, merges, token types (3 = control for the specials);
    ``tok`` None writes a GGUF without a tokenizer."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    if tok is not None:
        data = json.loads(tok.to_str())
        vocab = tok.get_vocab(with_added_tokens=True)
        tokens = sorted(vocab, key=vocab.get)
        specials = {t["content"] for t in data["added_tokens"]}
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([3 if t in specials else 1 for t in tokens])
        writer.add_token_merges([" ".join(m) if isinstance(m, list) else m
                                 for m in data["model"]["merges"]])
        if bos is not None:
            writer.add_bos_token_id(vocab[bos])
        writer.add_eos_token_id(vocab[eos])
        if add_bos is not None:
            writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
