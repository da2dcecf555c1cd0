"""Tokenizers (HF ``tokenizers``): byte-level by default, BPE trained on the corpus on request
(a pretrained model's tokenizer is read by :mod:`.tokenizer_source`).

Byte-level: ids 0–255 are the UTF-8 bytes themselves (GPT-2's byte-to-unicode alphabet,
no merges), then the special tokens. A trained BPE starts from the same 256-symbol byte
alphabet, so no text is ever out of vocabulary. Special tokens are never parsed out of
document text (``encode_special_tokens``): a corpus containing the literal string
``<|endoftext|>`` is encoded as ordinary bytes.

Every reader of a tokenizer.json (the pack, the trainer, evaluation, benchmarks, export)
finds its special ids here from the file alone: :func:`eos_id` and :func:`pad_id` by name,
:func:`bos_id` from the post-processor, so a pretrained vocabulary needs no added token.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from ..errors import DataError
from ..spec.config import TokenizerConfig
from ..spec.names import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, TOKENIZER_FILE

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map (what ByteLevel pre-tokenizes to)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _finish(tok: Tokenizer) -> Tokenizer:
    tok.decoder = decoders.ByteLevel()
    tok.encode_special_tokens = True
    return tok


def byte_level_tokenizer() -> Tokenizer:
    """256 byte tokens (id = byte value) + ``<|endoftext|>`` (256) + ``<|pad|>`` (257)."""
    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return _finish(tok)


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
    """Byte-level BPE trained on ``texts`` (streamed); specials get ids 0 and 1."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    log.info("trained BPE: %d tokens (asked for %d)", tok.get_vocab_size(), vocab_size)
    return _finish(tok)


def build_tokenizer(cfg: TokenizerConfig, texts: Iterable[str]) -> Tokenizer:
    """The byte or BPE tokenizer ``cfg`` asks for; ``texts`` is only read when training BPE.
    A file tokenizer is read by :func:`.tokenizer_source.tokenizer_from_source`."""
    assert cfg.type in ("byte", "bpe"), f"build_tokenizer builds no {cfg.type} tokenizer"
    if cfg.type == "byte":
        return byte_level_tokenizer()
    return train_bpe(texts, cfg.vocab_size, cfg.min_frequency)


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Read ``tokenizer.json`` (a file, or a data directory holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / TOKENIZER_FILE
    if not path.is_file():
        raise DataError(f"tokenizer file {path} does not exist; pack the data first "
                        "(python -m pipeline_lib pack)")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"tokenizer file {path} is not a valid tokenizer.json "
                        f"({str(exc).splitlines()[0]}); re-run the pack") from None
    tok.encode_special_tokens = True
    return tok


# End of a document: the first of these that the tokenizer has as a special token (loopline's
# own, GPT-2/SmolLM/Qwen, Llama 3, Llama 2/Mistral/T5, Gemma, DeepSeek). A name, not a
# remembered id, so that every reader of a tokenizer.json (pack, trainer, eval, bench,
# export) finds the same token without extra files, and a pretrained vocabulary is never
# extended. End-of-turn tokens (<|im_end|>, <|eot_id|>) are not document ends.
EOS_NAMES = (EOS_TOKEN, "<|end_of_text|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>")
# Fill of a row's tail: never a scored target (the loader masks padding by position), so
# without one of these the EOS id does.
PAD_NAMES = (PAD_TOKEN, "<pad>", "[PAD]")


def _first_special(tok: Tokenizer, names: tuple[str, ...]) -> int | None:
    special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return next((special[n] for n in names if n in special), None)


def eos_id(tok: Tokenizer) -> int:
    """Id of the token that ends every document: the first of :data:`EOS_NAMES` present
    (``<|endoftext|>`` in loopline's tokenizers)."""
    idx = _first_special(tok, EOS_NAMES)
    if idx is None:
        raise DataError(f"the tokenizer has none of the end-of-document tokens {list(EOS_NAMES)} "
                        "as a special token; use a tokenizer that has one (or re-run the pack)")
    return idx


def pad_id(tok: Tokenizer) -> int:
    """Id that fills the tail of a row (its targets are ignored): the first of
    :data:`PAD_NAMES` present (``<|pad|>`` in loopline's tokenizers), else :func:`eos_id`."""
    idx = _first_special(tok, PAD_NAMES)
    return eos_id(tok) if idx is None else idx


def bos_id(tok: Tokenizer) -> int | None:
    """Id the tokenizer's post-processor puts before a single text, else None. In a pack's
    tokenizer.json that is the token every document starts with (:func:`set_document_start`):
    ``tok.encode(text)`` then begins a prompt the way training documents began."""
    with_specials = tok.encode("a").ids
    plain = tok.encode("a", add_special_tokens=False).ids
    lead = len(with_specials) - len(plain)
    if lead == 1 and with_specials[1:] == plain:
        return with_specials[0]
    return None


def set_document_start(tok: Tokenizer, bos: int | None) -> None:
    """Make ``tok.encode(text)`` prepend ``bos`` (None: add nothing) and nothing else, so the
    saved tokenizer.json says how documents start (:func:`bos_id`); ids of text alone
    (``add_special_tokens=False``) are unchanged. A source's own post-processor (one that
    appends EOS, or adds a BOS the pack does not use) is replaced: it only adds specials
    (and trims offsets, which loopline never reads)."""
    if bos is None:
        tok.post_processor = None
        return
    name = tok.id_to_token(bos)
    key = "BOS" if ":" in name else name  # a template piece cannot contain ":"
    tok.post_processor = processors.TemplateProcessing(
        single=[key, "$A"], pair=[key, "$A", f"{key}:1", "$B:1"],
        special_tokens=[{"id": key, "ids": [bos], "tokens": [name]}])


class TokenEncoder:
    """Encodes batches of texts to one flat id array plus per-text lengths.

    Byte-level tokenizers take a fast path (the UTF-8 bytes are the ids), which gives the
    same ids as ``Tokenizer.encode`` (a test checks it) at a fraction of the cost.
    """

    def __init__(self, tok: Tokenizer, byte_level: bool):
        self.tok = tok
        self.byte_level = byte_level

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64 [sum of lengths], lengths int64 [len(texts)])."""
        if self.byte_level:
            parts = [t.encode("utf-8", errors="replace") for t in texts]
            lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
            ids = np.frombuffer(b"".join(parts), dtype=np.uint8).astype(np.int64)
            return ids, lengths
        encodings = self.tok.encode_batch(texts, add_special_tokens=False)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
        if not len(texts):
            return np.zeros(0, np.int64), lengths
        ids = np.concatenate([np.asarray(e.ids, dtype=np.int64) for e in encodings])
        return ids, lengths
