"""The metadata of a GGUF file, read without its tensors and without materialising arrays.

``gguf.GGUFReader`` parses every field into numpy views, a view per string of the 49 152
tokens and 48 900 merges of a small model: seconds. The planner needs only the number of
tokens and the pack a few scalars (BOS/EOS ids, ``add_bos_token``), so this walks the
key/value section with ``struct`` (the value type codes and the magic are the ``gguf``
package's) and keeps scalars and strings as values, arrays as :class:`GGUFArray` (item type
and length). No tensor data is touched; the file is memory-mapped, so only the pages of the
metadata section are read.

Layout (GGUF v2/v3, little endian): magic, version (u32), tensor count, key/value count
(u64), then per key a string (u64 length + UTF-8), a value type (u32) and the value; an
array is an item type (u32), a length (u64) and the items.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DataError

TOKENS_KEY = "tokenizer.ggml.tokens"  # the vocabulary: one string per id
MODEL_KEY = "tokenizer.ggml.model"  # tokenizer kind (gpt2, llama, t5, …)


@dataclass(frozen=True)
class GGUFArray:
    """An array value, by its item type (``gguf.GGUFValueType``) and length only."""

    item_type: int
    length: int


def _gguf_constants() -> tuple[int, Any]:
    try:
        # optional: gguf (the dev extra), only .gguf sources need it
        from gguf.constants import GGUF_MAGIC, GGUFValueType
    except ImportError:
        raise DataError("reading a .gguf file needs the gguf package; run `make install` "
                        "(or pip install gguf==0.19.0)") from None
    return GGUF_MAGIC, GGUFValueType


class _Cursor:
    """Sequential little-endian reads from a buffer."""

    def __init__(self, buf: Any, scalar_formats: dict[int, str], string_type: int,
                 array_type: int):
        self.buf, self.pos = buf, 0
        self.formats, self.string_type, self.array_type = scalar_formats, string_type, array_type

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.unpack("Q")
        raw = bytes(self.buf[self.pos:self.pos + n])
        if len(raw) != n:
            raise struct.error("string past the end of the file")
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, value_type: int) -> Any:
        if value_type == self.string_type:
            return self.string()
        if value_type == self.array_type:
            item_type, length = self.unpack("I"), self.unpack("Q")
            self.skip_items(item_type, length)
            return GGUFArray(item_type, length)
        if value_type not in self.formats:
            raise struct.error(f"unknown value type {value_type}")
        return self.unpack(self.formats[value_type])

    def skip_items(self, item_type: int, length: int) -> None:
        if item_type in self.formats:
            self.pos += struct.calcsize(self.formats[item_type]) * length
        elif item_type == self.string_type:
            for _ in range(length):  # each string is its length, then its bytes
                self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]
        else:
            for _ in range(length):
                self.value(item_type)


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """Every metadata key of the GGUF file ``path``: scalars and strings as values, arrays as
    :class:`GGUFArray`. One-line DataError when the file is not a readable GGUF."""
    return read_gguf_header(path).fields


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One tensor-info record: name, dims (GGUF order: innermost first), type code and
    offset (from the start of the aligned tensor-data section)."""

    name: str
    dims: tuple[int, ...]
    type_code: int
    offset: int


@dataclass(frozen=True)
class GGUFHeader:
    """Metadata fields, tensor-info records, where the tensor data begins and the file size."""

    fields: dict[str, Any]
    tensors: list[GGUFTensorInfo]
    data_start: int
    file_size: int


def read_gguf_header(path: Path, *, tensors: bool = False) -> GGUFHeader:
    """:func:`read_gguf_metadata`'s fields and, when ``tensors``, the tensor-info records after
    them (read without touching tensor data; the data section starts at the next multiple of
    ``general.alignment``, 32 by default)."""
    magic, vt = _gguf_constants()
    formats = {vt.UINT8: "B", vt.INT8: "b", vt.UINT16: "H", vt.INT16: "h", vt.UINT32: "I",
               vt.INT32: "i", vt.FLOAT32: "f", vt.BOOL: "?", vt.UINT64: "Q", vt.INT64: "q",
               vt.FLOAT64: "d"}
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            cur = _Cursor(buf, {int(k): v for k, v in formats.items()}, int(vt.STRING),
                          int(vt.ARRAY))
            if cur.unpack("I") != magic:
                raise DataError(f"{path} is not a GGUF file (its first bytes are not the GGUF "
                                "magic); download it again, or point at a real .gguf model file")
            version = cur.unpack("I")
            if version not in (2, 3):
                raise DataError(f"GGUF file {path} has version {version}; only versions 2 and 3 "
                                "are read: convert it with a current llama.cpp")
            n_tensors = cur.unpack("Q")
            fields = {cur.string(): cur.value(cur.unpack("I")) for _ in range(cur.unpack("Q"))}
            infos = [_tensor_info(cur) for _ in range(n_tensors if tensors else 0)]
            align = fields.get("general.alignment", 32)
            align = align if isinstance(align, int) and align > 0 else 32
            return GGUFHeader(fields, infos, -(-cur.pos // align) * align, len(buf))
    except (struct.error, ValueError) as exc:  # ValueError: mmap of an empty file
        raise DataError(f"GGUF file {path} is truncated or corrupt ({exc}); download it "
                        "again") from None
    except OSError as exc:
        raise DataError(f"cannot read GGUF file {path}: {exc.strerror or exc}; check the "
                        "path and its permissions") from None


def _tensor_info(cur: _Cursor) -> GGUFTensorInfo:
    """name, dims (u32 count, u64 each), type (u32), offset (u64)."""
    name = cur.string()
    dims = tuple(cur.unpack("Q") for _ in range(cur.unpack("I")))
    return GGUFTensorInfo(name, dims, cur.unpack("I"), cur.unpack("Q"))
