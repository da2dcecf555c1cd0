"""Which tokenizer a pack or a snapshot holds, and the one check that a model fits its data.

A model's token ids mean what its training tokenizer made them mean: a snapshot trained on
the SmolLM2 vocabulary scored on a byte-tokenizer pack gives losses that measure nothing,
although the pack's 258 ids fit in the model's 49,152 rows. Sizes cannot tell; identities
can. Both sides already carry their tokenizer:

- a pack: ``tokenizer.json`` (its sha256 in ``metadata.json``, its settings in
  ``metadata["tokenizer"]``);
- a snapshot: the pack's ``tokenizer.json``, copied byte for byte by the trainer (import-hf
  writes its source's), covered by ``MANIFEST.json``; its settings in ``config.yaml``
  (``data.tokenizer``).

The identity is the sha256 of ``tokenizer.json``'s canonical JSON without the parts that
do not change what an id means: the post-processor (whether a BOS is added), padding and
truncation. A snapshot without ``tokenizer.json`` (written before snapshots carried their
tokenizer) has no identity; it is judged as before, by size (the data's ids must fit the
model's rows). :func:`check_same_tokenizer` is the one check that evaluation, benchmarks,
training resume and warm start call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError
from ..spec.names import TOKENIZER_FILE

# Keys of tokenizer.json that do not change which text an id stands for.
NOT_IDENTITY = ("post_processor", "padding", "truncation", "version")


@dataclass(frozen=True)
class TokenizerIdentity:
    """A tokenizer as one side of a comparison: ``digest`` (None: not recorded), its
    vocabulary size, and ``label``, how it is named in a message."""

    digest: str | None
    vocab_size: int
    label: str


def tokenizer_digest(path: Path) -> str:
    """sha256 of ``path``'s (a tokenizer.json) canonical JSON without :data:`NOT_IDENTITY`."""
    try:
        doc = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise DataError(f"tokenizer file {path} cannot be read as JSON ({exc}); it is "
                        "damaged: re-create it (re-pack, or rerun the segment)") from None
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k not in NOT_IDENTITY}
    blob = json.dumps(doc, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()


def describe_settings(settings: Mapping[str, Any] | None, vocab_size: int) -> str:
    """``byte tokenizer (258 ids)``, ``file tokenizer from PATH (49152 ids)``: from the
    ``data.tokenizer`` settings a pack's metadata or a snapshot's config records."""
    if not settings:
        return f"tokenizer ({vocab_size} ids)"
    kind = settings.get("type")
    source = f" from {settings['path']}" if kind == "file" and settings.get("path") else ""
    return f"{kind} tokenizer{source} ({vocab_size} ids)"


def identify(directory_or_file: Path, settings: Mapping[str, Any] | None,
             vocab_size: int) -> TokenizerIdentity:
    """The identity of the tokenizer in a pack or snapshot directory (or of a tokenizer.json
    file); ``settings``: its ``data.tokenizer`` section, for the label."""
    path = Path(directory_or_file)
    file = path / TOKENIZER_FILE if path.is_dir() else path
    digest = tokenizer_digest(file) if file.is_file() else None
    label = describe_settings(settings, vocab_size)
    if digest is not None:
        label = f"{label}, identity {digest[:12]}"
    return TokenizerIdentity(digest, vocab_size, label)


def snapshot_identity(snapshot: Path, cfg: Any) -> TokenizerIdentity:
    """The tokenizer a snapshot was trained on (``cfg``: its resolved config)."""
    return identify(Path(snapshot), dataclasses.asdict(cfg.data.tokenizer),
                    cfg.model.vocab_size)


def pack_identity(data_dir: Path, metadata: Mapping[str, Any]) -> TokenizerIdentity:
    """The tokenizer a pack was tokenized with (``metadata``: its metadata.json)."""
    return identify(Path(data_dir), metadata.get("tokenizer"), int(metadata["vocab_size"]))


def check_same_tokenizer(model: TokenizerIdentity, data: TokenizerIdentity, *, use: str,
                         model_name: str, data_name: str, fix: str) -> None:
    """Raise DataError when the data's token ids do not mean what the model learned.

    ``use`` says what was attempted (``H_eff sweep``, ``resume``, …), ``model_name`` /
    ``data_name`` the two sides (``snapshot DIR``, ``the pack DIR``), ``fix`` the way out.
    Both identities known: they must be equal. The model's unknown (an older snapshot): the
    data's ids must fit the model's rows, as before identities were compared."""
    if model.digest is not None and data.digest is not None:
        if model.digest == data.digest:
            return
        raise DataError(f"{use}: {model_name} was trained on the {model.label}, but "
                        f"{data_name} holds the {data.label}; their token ids mean different "
                        f"things: {fix}")
    if data.vocab_size > model.vocab_size:
        raise DataError(f"{use}: {data_name} has {data.vocab_size} token ids, but {model_name} "
                        f"has only {model.vocab_size}: {fix}")


def check_model_fits_pack(snapshot: Path, cfg: Any, data: Any, *, use: str,
                          fix: str | None = None) -> None:
    """:func:`check_same_tokenizer` of a snapshot (``cfg``: its config) and a pack
    (``data``: a :class:`~.loader.PackedData`); ``fix`` defaults to naming both ways out."""
    fix = fix or (f"pass the pack the snapshot was trained on, or pack this corpus with the "
                  f"snapshot's tokenizer (data.tokenizer: {{type: file, path: "
                  f"{Path(snapshot) / TOKENIZER_FILE}}})")
    check_same_tokenizer(snapshot_identity(snapshot, cfg),
                         pack_identity(data.data_dir, data.metadata), use=use,
                         model_name=f"snapshot {snapshot}", data_name=f"the pack {data.data_dir}",
                         fix=fix)


__all__ = ["TokenizerIdentity", "check_model_fits_pack", "check_same_tokenizer",
           "describe_settings", "identify", "pack_identity", "snapshot_identity",
           "tokenizer_digest"]
