"""A pretrained model's tokenizer (``data.tokenizer.type: file``) as a ``tokenizers.Tokenizer``.

:func:`tokenizer_from_source` is the one entry point, shared by the pack (which saves the
result as the pack's ``tokenizer.json``) and the model importer (which puts it into an
imported snapshot). Sources (see :mod:`.tokenizer_files`): a ``tokenizer.json``, a Hugging
Face directory, or a ``.gguf`` file. A GGUF holds no tokenizer.json, only the vocabulary,
merges and special ids as metadata; transformers' GGUF support rebuilds the fast tokenizer
from them (``transformers.integrations.gguf``: ``get_gguf_tokenizer`` then
``convert_gguf_tokenizer``, the backend ``AutoTokenizer.from_pretrained(dir, gguf_file=…)``
uses, without building the Python tokenizer around it). transformers, and with it torch, is
imported only there, lazily, and only for GGUF.

The vocabulary is never changed (a pretrained embedding has exactly its rows): the end of a
document is a token the tokenizer already has (:data:`.tokenizer.EOS_NAMES`), padding one of
:data:`.tokenizer.PAD_NAMES` or the EOS. What changes is that truncation and padding stored
in a tokenizer.json are switched off (the pack encodes whole documents) and that the
post-processor is set to prepend the document-start BOS, or nothing
(:func:`.tokenizer.set_document_start`), so the saved file records it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ..errors import DataError
from ..spec.names import CONFIG_JSON, TOKENIZER_FILE
from ..spec.tokenizer_id import (
    HF_SIDE_FILES,
    KIND_GGUF,
    KIND_HF_DIR,
    source_kind,
    tokenizer_source_fingerprint,
)
from .tokenizer import EOS_NAMES, bos_id, eos_id, pad_id, set_document_start
from .tokenizer_files import check_tokenizer_source, gguf_tokenizer_metadata, read_json

log = logging.getLogger(__name__)
ADD_BOS_CHOICES = ("auto", "true", "false")


@dataclass(frozen=True)
class TokenizerInfo:
    """What loopline records about a pretrained tokenizer beside its tokenizer.json."""

    path: str  # the source as given (data.tokenizer.path)
    kind: str  # tokenizer.json, hf_directory or gguf
    vocab_size: int  # highest id + 1: the embedding rows the vocabulary needs
    eos_id: int  # ends every document (.tokenizer.eos_id)
    pad_id: int  # fills the tail of a row (.tokenizer.pad_id)
    bos_id: int | None  # starts every document; None = documents start with their text
    source_bos_id: int | None  # the BOS the source declares (used or not)
    source_eos_id: int | None  # the EOS the source declares (may be an end-of-turn token)
    source_add_bos: bool  # whether the source asks for a BOS before each text
    fingerprint: dict[str, Any]  # spec.tokenizer_id.tokenizer_source_fingerprint

    @property
    def add_bos(self) -> bool:
        return self.bos_id is not None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Declared:
    """What a source says about its special tokens."""

    bos: int | None = None
    eos: int | None = None
    add_bos: bool = False


def _token_id(tok: Tokenizer, value: Any) -> int | None:
    """Id of a token given as a name, an AddedToken dict ({"content": …}) or an id list."""
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return tok.token_to_id(value) if isinstance(value, str) else None


def _from_json(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"{path} is not a valid tokenizer.json ({str(exc).splitlines()[0]}); "
                        "point data.tokenizer.path at a tokenizers tokenizer.json") from None


def _hf_directory(path: Path, tok: Tokenizer, known: dict[str, Any]) -> _Declared:
    """BOS/EOS and add_bos_token from tokenizer_config.json, special_tokens_map.json and
    config.json (``known``: read already), in that order; else the post-processor's BOS."""
    side = {name: known[name] if name in known else read_json(path / name)
            for name in HF_SIDE_FILES if name in known or (path / name).is_file()}
    tok_cfg, special, model_cfg = (side.get(n, {}) for n in HF_SIDE_FILES)

    def declared(name: str) -> int | None:
        for value in (tok_cfg.get(f"{name}_token"), special.get(f"{name}_token"),
                      model_cfg.get(f"{name}_token_id")):
            if (idx := _token_id(tok, value)) is not None:
                return idx
        return None

    prefix, bos, add_bos = bos_id(tok), declared("bos"), tok_cfg.get("add_bos_token")
    return _Declared(bos=prefix if bos is None else bos, eos=declared("eos"),
                     add_bos=prefix is not None if add_bos is None else bool(add_bos))


def _gguf(path: Path) -> tuple[Tokenizer, _Declared, int]:
    """The fast tokenizer transformers builds from the GGUF's metadata, what the file declares,
    and its number of tokens."""
    meta = gguf_tokenizer_metadata(path)  # cheap checks first: no tokenizer, no import
    try:
        # optional: transformers (the dev extra), GGUF tokenizers only
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError:
        raise DataError(f"building the tokenizer of GGUF file {path} needs transformers "
                        "(with torch and gguf); run `make install` (the dev extra)") from None
    try:
        architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
        tok, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except (ValueError, KeyError) as exc:
        raise DataError(f"transformers cannot build a tokenizer from GGUF file {path} "
                        f"({str(exc).splitlines()[0]}); point data.tokenizer.path at the "
                        "model's tokenizer.json instead") from None
    tok = _within_vocabulary(tok, meta["tokenizer.ggml.tokens"].length, path)
    # add_bos_token as transformers reads it: the file's flag, else llama.cpp's default
    # (on for sentencepiece vocabularies); the ids as the file states them.
    declared = _Declared(bos=meta.get("tokenizer.ggml.bos_token_id"),
                         eos=meta.get("tokenizer.ggml.eos_token_id"),
                         add_bos=bool(tokenizer_config.get("add_bos_token", False)))
    return tok, declared, meta["tokenizer.ggml.tokens"].length


def _within_vocabulary(tok: Tokenizer, n_tokens: int, path: Path) -> Tokenizer:
    """``tok`` without the added tokens past the file's ``n_tokens`` (transformers' GPT-2
    tokenizer adds its default ``<|endoftext|>`` when the vocabulary has none): the model's
    embedding has exactly ``n_tokens`` rows."""
    data = json.loads(tok.to_str())
    extra = [t["content"] for t in data.get("added_tokens") or () if t["id"] >= n_tokens]
    if not extra:
        return tok
    log.info("%s: dropping %s, added by transformers past the file's %d tokens", path,
             extra, n_tokens)
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < n_tokens]
    return Tokenizer.from_str(json.dumps(data))


def _document_bos(path: Path, add_bos: str, declared: _Declared) -> int | None:
    if add_bos not in ADD_BOS_CHOICES:
        raise DataError(f"data.tokenizer.add_bos = {add_bos!r}; use one of {ADD_BOS_CHOICES}")
    wanted = declared.add_bos if add_bos == "auto" else add_bos == "true"
    if wanted and declared.bos is None:
        raise DataError(f"the tokenizer {path} declares no BOS token, so data.tokenizer.add_bos "
                        f"= {add_bos} cannot prepend one; set data.tokenizer.add_bos to false")
    return declared.bos if wanted else None


def _vocab_size(tok: Tokenizer) -> int:
    ids = list(tok.get_vocab(with_added_tokens=True).values())
    return max(ids, default=-1) + 1


def _load(p: Path, kind: str, known: dict[str, Any]) -> tuple[Tokenizer, _Declared]:
    """The source's tokenizer, encoding whole texts (no stored truncation or padding, which
    would cut or pad documents and hide a BOS), and what the source declares."""
    n_tokens = None
    if kind == KIND_GGUF:
        tok, declared, n_tokens = _gguf(p)
    else:
        tok = _from_json(p / TOKENIZER_FILE if kind == KIND_HF_DIR else p)
    tok.no_truncation()
    tok.no_padding()
    tok.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is text
    if kind == KIND_HF_DIR:
        declared = _hf_directory(p, tok, known)
    elif kind != KIND_GGUF:  # a bare tokenizer.json: only its post-processor can say
        declared = _Declared(bos=bos_id(tok), add_bos=bos_id(tok) is not None)
    if n_tokens is not None and _vocab_size(tok) != n_tokens:
        raise DataError(f"transformers built a tokenizer of {_vocab_size(tok)} ids from GGUF "
                        f"file {p}, which lists {n_tokens} tokens; point data.tokenizer.path "
                        "at the model's tokenizer.json instead")
    return tok, declared


def tokenizer_from_source(path: str | Path, add_bos: str = "auto", *,
                          config_json: dict[str, Any] | None = None
                          ) -> tuple[Tokenizer, TokenizerInfo]:
    """The tokenizer at ``path`` (tokenizer.json, HF directory or .gguf) and its
    :class:`TokenizerInfo`, for the pack and the model importer alike.

    The vocabulary is the source's, id for id. ``add_bos``: auto (as the source says:
    ``add_bos_token`` in tokenizer_config.json or the GGUF, else a post-processor that
    prepends a token), true or false; the returned tokenizer's post-processor prepends that
    BOS or nothing. EOS and padding are found by name (:func:`.tokenizer.eos_id`,
    :func:`.tokenizer.pad_id`); ``config_json``: the HF directory's, read already. Raises a
    one-line DataError naming the path for a missing or unusable source, before anything is
    written.
    """
    source = str(path)
    p = check_tokenizer_source(source)
    kind = source_kind(p)
    tok, declared = _load(p, kind, {} if config_json is None else {CONFIG_JSON: config_json})
    bos = _document_bos(p, add_bos, declared)
    set_document_start(tok, bos)
    assert bos_id(tok) == bos, "the post-processor does not prepend the document BOS"
    try:
        eos = eos_id(tok)
    except DataError:
        raise DataError(f"the tokenizer {p} has none of the end-of-document tokens "
                        f"{list(EOS_NAMES)} as a special token, so documents cannot be "
                        "ended; use a tokenizer that has one") from None
    if declared.eos is not None and declared.eos != eos:
        log.info("%s declares EOS %r; documents end with %r instead (an end-of-document "
                 "token)", p, tok.id_to_token(declared.eos), tok.id_to_token(eos))
    info = TokenizerInfo(path=source, kind=kind, vocab_size=_vocab_size(tok), eos_id=eos,
                         pad_id=pad_id(tok), bos_id=bos, source_bos_id=declared.bos,
                         source_eos_id=declared.eos, source_add_bos=declared.add_bos,
                         fingerprint=tokenizer_source_fingerprint(source))
    return tok, info
