"""One validated reader of a pretrained source, run before any work.

``read_source(path)`` opens an HF model directory (``config.json`` and ``model.safetensors``,
several ``*.safetensors`` or a sharded ``model.safetensors.index.json``) or a GGUF file and
checks it from its headers alone: the config key by key (:mod:`.source_config`), then every
tensor file's header, each tensor's byte range against its dtype and shape and against the
file's size, and every tensor loopline reads against the shape the config implies
(:func:`.hf_layout.source_tensor_shapes`). A damaged or odd source is one
:class:`~pipeline_lib.errors.DataError` naming the file, the key or tensor and what is wrong
(a truncated file, a shard the index names that is missing, a config that does not describe
its weights). Torch-free and cheap (headers only, no tensor data is read): the planner runs
it on every Snakemake call, so a dry run reports what the import job would otherwise die of.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path

from ..data.gguf_metadata import read_gguf_header
from ..errors import DataError
from ..spec.names import CONFIG_JSON
from .hf_layout import SourceArch, is_gguf, source_tensor_shapes
from .source_config import gguf_arch, hf_arch

log = logging.getLogger(__name__)

SAFETENSORS_INDEX = "model.safetensors.index.json"
# safetensors dtype → bytes per element; loopline imports the floating-point ones
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1,
               "F8_E5M2": 1}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit
AGAIN = "download the model again"
GGUF_UNREAD = {"rope_freqs.weight": "Llama 3.1-style RoPE scaling stored as frequency factors"}


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lies and what its header says (shape in torch order)."""

    file: Path
    dtype: str  # safetensors dtype, or the GGML type name of a GGUF tensor
    shape: tuple[int, ...]


@dataclass(frozen=True)
class PretrainedSource:
    """A checked source: its architecture and the header of every tensor, by source name."""

    path: Path
    arch: SourceArch
    tensors: dict[str, TensorInfo]

    @property
    def gguf(self) -> bool:
        return is_gguf(self.path)


def read_source(source: str | Path) -> PretrainedSource:
    """The checked source at ``source`` (see the module docstring); DataError otherwise."""
    path = Path(source).expanduser()
    if not path.exists():
        raise DataError(f"model source {path} does not exist; pass a Hugging Face model "
                        "directory (config.json + *.safetensors) or a .gguf file")
    if is_gguf(path) and path.is_file():
        arch, tensors = _gguf_source(path)
    elif path.is_dir():
        arch = hf_arch(path)
        tensors = _hf_tensors(path)
        if arch.tie_embeddings and "lm_head.weight" in tensors:
            # transformers keeps a head the checkpoint holds (it ties only equal ones; an
            # equal copy gives the same logits): so does loopline
            log.info("%s: tie_word_embeddings is true but the weights hold lm_head.weight; "
                     "importing it as a separate output head, as transformers does", path)
            arch = replace(arch, tie_embeddings=False)
    else:
        raise DataError(f"model source {path} is neither a directory nor a .gguf file; pass "
                        "a Hugging Face model directory or a GGUF file")
    _check_tensors(path, arch, tensors)
    return PretrainedSource(path, arch, tensors)


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of an HF directory that :func:`read_source` reads: the shards
    its index names (in order), else every ``*.safetensors``."""
    index = directory / SAFETENSORS_INDEX
    if not index.is_file():
        return sorted(directory.glob("*.safetensors"))
    return [directory / shard for shard in dict.fromkeys(_weight_map(index).values())]


def _check_tensors(path: Path, arch: SourceArch, tensors: dict[str, TensorInfo]) -> None:
    """Every tensor loopline reads is there, of a type it reads, with the config's shape."""
    gguf = is_gguf(path)
    for name, shape in source_tensor_shapes(arch, gguf).items():
        info = tensors.get(name)
        if info is None and name == "lm_head.weight":
            raise DataError(f"model source {path} has no lm_head.weight, and its config.json "
                            "says tie_word_embeddings = false (transformers would start that "
                            "head from random weights); if the embedding is the head, set "
                            "tie_word_embeddings: true there")
        if info is None:
            raise DataError(f"model source {path} lacks tensor {name}; the checkpoint is "
                            f"incomplete or not a {arch.architecture} ({AGAIN})")
        if info.shape != shape:
            config = "its metadata" if gguf else path / CONFIG_JSON
            raise DataError(f"{info.file}: tensor {name} has shape {list(info.shape)}, but "
                            f"{config} implies {list(shape)}; the config does not describe "
                            "these weights")
        if not (_dequantizable(info.dtype) if gguf else info.dtype in FLOAT_DTYPES):
            why, kinds = (("the gguf package cannot dequantize",
                           "F32, F16, BF16, Q8_0 or Q4_0/Q4_1/Q5_x/Qk_K") if gguf else
                          ("is not floating point", ", ".join(FLOAT_DTYPES)))
            raise DataError(f"{info.file}: tensor {name} is stored as {info.dtype}, which "
                            f"{why}; use a file stored as {kinds}")
    for name, what in GGUF_UNREAD.items() if gguf else ():
        if name in tensors:
            raise DataError(f"{path}: tensor {name} ({what}) is not read by loopline's GGUF "
                            "import; import the model's Hugging Face directory instead")


def _dequantizable(type_name: str) -> bool:
    """Whether the gguf package dequantizes GGML type ``type_name`` (F32, F16, or a type
    with its own class in ``gguf.quants``)."""
    import gguf.quants  # optional: gguf (the dev extra), only .gguf sources need it

    return type_name in ("F32", "F16") or isinstance(getattr(gguf.quants, type_name, None),
                                                     type)


# --------------------------------------------------------------------------- safetensors


def _hf_tensors(directory: Path) -> dict[str, TensorInfo]:
    """Headers of the directory's safetensors: the shards its index names, else every
    ``*.safetensors`` file (a tensor in two files is refused)."""
    index = directory / SAFETENSORS_INDEX
    if index.is_file():
        return _indexed_tensors(index)
    files = weight_files(directory)
    if not files:
        bins = sorted(p.name for p in directory.glob("*.bin"))
        hint = (f" (it has {', '.join(bins)}: pickled weights, which loopline never loads; "
                "convert them to safetensors with transformers' save_pretrained)" if bins else "")
        raise DataError(f"model source {directory} has no *.safetensors weights{hint}")
    tensors: dict[str, TensorInfo] = {}
    for file in files:
        for name, info in safetensors_header(file).items():
            if name in tensors:
                raise DataError(f"{directory}: tensor {name} is in both {tensors[name].file.name}"
                                f" and {file.name}; keep one copy (or add the "
                                f"{SAFETENSORS_INDEX} that says which file holds what)")
            tensors[name] = info
    return tensors


def _weight_map(index: Path) -> dict[str, str]:
    """The index's tensor name → shard file name."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, AttributeError) as exc:
        raise DataError(f"{index} is not a readable JSON object ({str(exc).splitlines()[0]}); "
                        f"{AGAIN}") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()):
        raise DataError(f"{index}: weight_map is missing or not a map of tensor names to "
                        f"shard files; {AGAIN}")
    return weight_map


def _indexed_tensors(index: Path) -> dict[str, TensorInfo]:
    weight_map, headers = _weight_map(index), {}
    for name, shard in weight_map.items():
        if shard not in headers:
            file = index.parent / shard
            if not file.is_file():
                raise DataError(f"{index}: weight_map puts {name} in {shard}, which is missing "
                                f"from {index.parent}; download that shard again")
            headers[shard] = safetensors_header(file)
        if name not in headers[shard]:
            raise DataError(f"{index}: weight_map puts {name} in {shard}, whose header lacks "
                            f"it; the index and its shards disagree ({AGAIN})")
    return {name: headers[shard][name] for name, shard in weight_map.items()}


def safetensors_header(file: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file, checked against its size: each byte range fits
    its dtype and shape, the ranges tile the data section exactly (safetensors' own rule)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if length is None or length > min(size - 8, MAX_HEADER_BYTES):
                what = "empty (0 bytes)" if size == 0 else f"truncated ({size} bytes, shorter "\
                    "than its own header)"
                raise DataError(f"{file} is {what}; {AGAIN}")
            header = json.loads(fh.read(length))
    except OSError as exc:
        raise DataError(f"cannot read {file}: {exc.strerror or exc}; check its permissions") \
            from None
    except ValueError as exc:  # JSON or UTF-8
        raise DataError(f"{file}: its header is not valid JSON ({str(exc).splitlines()[0]}); "
                        f"the file is damaged, {AGAIN}") from None
    if not isinstance(header, dict):
        raise DataError(f"{file}: its header is not a JSON object; the file is damaged, {AGAIN}")
    return _tile(file, header, size - 8 - length)


def _tile(file: Path, header: dict, data_bytes: int) -> dict[str, TensorInfo]:
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, offsets = (entry.get(k) for k in ("dtype", "shape", "data_offsets")) \
            if isinstance(entry, dict) else (None, None, None)
        if (dtype not in DTYPE_BYTES or not _ints(shape) or not _ints(offsets)
                or len(offsets) != 2 or offsets[0] > offsets[1]):
            raise DataError(f"{file}: the header entry of tensor {name} is malformed "
                            f"({json.dumps(entry)[:120]}); the file is damaged, {AGAIN}")
        begin, end = offsets
        if end - begin != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise DataError(f"{file}: tensor {name} spans {end - begin} bytes, but {dtype} of "
                            f"shape {shape} needs {math.prod(shape) * DTYPE_BYTES[dtype]}; the "
                            f"file is damaged, {AGAIN}")
        if end > data_bytes:
            raise DataError(f"{file} is truncated: tensor {name} ends {end - data_bytes} bytes "
                            f"past the end of the file; {AGAIN}")
        spans.append((begin, end, name))
        tensors[name] = TensorInfo(file, dtype, tuple(shape))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            raise DataError(f"{file}: tensor {name} starts at data byte {begin}, not where the "
                            f"one before it ends ({covered}); the file is damaged, {AGAIN}")
        covered = end
    if covered != data_bytes:
        raise DataError(f"{file} has {data_bytes - covered} bytes after its last tensor; the "
                        f"file is damaged, {AGAIN}")
    return tensors


def _ints(values: object) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values)


# --------------------------------------------------------------------------- GGUF


def _gguf_source(path: Path) -> tuple[SourceArch, dict[str, TensorInfo]]:
    """The metadata and the tensor-info records of a GGUF file, each tensor's bytes
    (type block size × element count) checked to lie inside the file."""
    # optional: gguf (the dev extra), only .gguf sources need it
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    header = read_gguf_header(path, tensors=True)
    tensors = {}
    for t in header.tensors:
        try:
            kind = GGMLQuantizationType(t.type_code)
            block, block_bytes = GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise DataError(f"{path}: tensor {t.name} has the unknown GGML type {t.type_code}; "
                            f"the file is damaged or newer than the gguf package, {AGAIN}") \
                from None
        count = math.prod(t.dims)
        if t.dims and t.dims[0] % block:
            raise DataError(f"{path}: tensor {t.name} of {kind.name} has rows of {t.dims[0]} "
                            f"values, not a multiple of its block of {block}; the file is "
                            f"damaged, {AGAIN}")
        end = header.data_start + t.offset + count // block * block_bytes
        if end > header.file_size:
            raise DataError(f"{path} is truncated: tensor {t.name} ends "
                            f"{end - header.file_size} bytes past the end of the file; {AGAIN}")
        tensors[t.name] = TensorInfo(path, kind.name, tuple(reversed(t.dims)))
    return gguf_arch(path, header.fields, set(tensors)), tensors
