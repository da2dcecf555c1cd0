"""What loopline knows of Hugging Face Llama-family checkpoints, in one table (import side).

Torch-free and cheap: the Snakefile reads a source's architecture through this module on
every call (a ``model.init_from`` run derives its model section from it). The weights
themselves are read by :mod:`.hf_import`.

Sources: a Hugging Face model directory (``config.json`` + safetensors, sharded or not) or a
GGUF file (metadata read by the ``gguf`` package). Supported: ``LlamaForCausalLM``
(SmolLM/SmolLM2, TinyLlama, Llama 2, Llama 3 with its RoPE scaling) and
``MistralForCausalLM``. ``Qwen2ForCausalLM`` is refused: its q/k/v projections carry
biases, which loopline's attention does not have.

Conventions, and where each is handled:

- loopline fuses q, k and v into one projection ``attn.qkv`` whose output rows are all q
  heads, then all k heads, then all v heads: HF's ``q_proj``, ``k_proj``, ``v_proj`` weights
  concatenated row-wise in that order (:data:`BLOCK_TENSORS`).
- RoPE: HF Llama rotates (x_i, x_{i+d/2}) pairs ("rotate_half"), as loopline does, so HF
  weights are used as they are. llama.cpp rotates adjacent pairs (x_{2i}, x_{2i+1}) and its
  converter permutes the rows of q and k within each head to match; GGUF's q and k rows are
  permuted back by :func:`unpermute_rows` (the exactness tests catch a wrong inverse).
- GQA: ``num_key_value_heads`` → ``model.n_kv_heads``; query head i reads kv head
  i // (heads / kv_heads), in HF and in loopline.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DataError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
REFUSED = {"Qwen2ForCausalLM": "its q/k/v projections have biases, which loopline's "
                               "attention does not have"}
CONFIG_JSON = "config.json"

# loopline block tensor → (HF tensor names under model.layers.{i}., GGUF names under blk.{i}.);
# several names are concatenated row-wise (dim 0) in the order given.
BLOCK_TENSORS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "attn_norm.weight": (("input_layernorm.weight",), ("attn_norm.weight",)),
    "attn.qkv.weight": (("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                         "self_attn.v_proj.weight"),
                        ("attn_q.weight", "attn_k.weight", "attn_v.weight")),
    "attn.out.weight": (("self_attn.o_proj.weight",), ("attn_output.weight",)),
    "ffn_norm.weight": (("post_attention_layernorm.weight",), ("ffn_norm.weight",)),
    "ffn.gate.weight": (("mlp.gate_proj.weight",), ("ffn_gate.weight",)),
    "ffn.up.weight": (("mlp.up_proj.weight",), ("ffn_up.weight",)),
    "ffn.down.weight": (("mlp.down_proj.weight",), ("ffn_down.weight",)),
}
# loopline top-level tensor → (HF name, GGUF name)
TOP_TENSORS = {"tok_emb.weight": ("model.embed_tokens.weight", "token_embd.weight"),
               "norm.weight": ("model.norm.weight", "output_norm.weight"),
               "head.weight": ("lm_head.weight", "output.weight")}
GGUF_PERMUTED = {"attn_q.weight": "heads", "attn_k.weight": "kv_heads"}  # llama.cpp's RoPE rows


def hf_block_prefix(layer: int) -> str:
    return f"model.layers.{layer}."


def gguf_block_prefix(layer: int) -> str:
    return f"blk.{layer}."


def is_gguf(source: Path) -> bool:
    return Path(source).suffix.lower() == ".gguf"


# --------------------------------------------------------------------------- the source's config


@dataclass(frozen=True)
class SourceArch:
    """The architecture of a pretrained checkpoint, in the terms loopline needs."""

    architecture: str
    vocab_size: int
    hidden_size: int
    layers: int
    heads: int
    kv_heads: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any]  # {} or HF's rope_scaling / rope_parameters (llama3, linear)
    tie_embeddings: bool
    max_positions: int
    sliding_window: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads


def source_arch(source: str | Path) -> SourceArch:
    """The architecture of ``source`` (an HF model directory or a GGUF file), read cheaply.

    Raises :class:`DataError` for a missing source, an unsupported architecture (naming the
    supported ones) or a config loopline cannot express.
    """
    source = Path(source).expanduser()
    if not source.exists():
        raise DataError(f"model source {source} does not exist; pass a Hugging Face model "
                        "directory (config.json + *.safetensors) or a .gguf file")
    if is_gguf(source):
        arch = _gguf_arch(source)
    elif source.is_dir():
        arch = _hf_arch(source)
    else:
        raise DataError(f"model source {source} is neither a directory nor a .gguf file; pass "
                        "a Hugging Face model directory or a GGUF file")
    _check_expressible(arch, source)
    return arch


def _hf_arch(directory: Path) -> SourceArch:
    path = directory / CONFIG_JSON
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"model source {directory} has no {CONFIG_JSON}; pass a Hugging Face "
                        "model directory (save_pretrained writes one)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not readable JSON ({exc}); re-download the model") from None
    archs = config.get("architectures") or [config.get("model_type", "?")]
    arch = str(archs[0])
    _check_architecture(arch, path)
    rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", None) or config.get("rope_theta") or 10000.0
    heads = int(config["num_attention_heads"])
    hidden = int(config["hidden_size"])
    _check_hf_options(config, path, hidden // heads)
    return SourceArch(
        architecture=arch, vocab_size=int(config["vocab_size"]), hidden_size=hidden,
        layers=int(config["num_hidden_layers"]), heads=heads,
        kv_heads=int(config.get("num_key_value_heads") or heads),
        intermediate_size=int(config["intermediate_size"]),
        rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
        rope_scaling=_rope_scaling(rope, path), tie_embeddings=bool(
            config.get("tie_word_embeddings", False)),
        max_positions=int(config.get("max_position_embeddings", 2048)),
        sliding_window=config.get("sliding_window"))


def _check_hf_options(config: Mapping[str, Any], path: Path, head_dim: int) -> None:
    """Options of the HF config that loopline's blocks cannot express."""
    if config.get("hidden_act", "silu") != "silu":
        raise DataError(f"{path}: hidden_act = {config['hidden_act']!r}; loopline's FFN is "
                        "SwiGLU (silu) only")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise DataError(f"{path}: {key} = true; loopline's projections have no biases")
    if config.get("head_dim") not in (None, head_dim):
        raise DataError(f"{path}: head_dim = {config['head_dim']} differs from hidden_size / "
                        f"num_attention_heads = {head_dim}; loopline derives it, so such "
                        "models are not supported")


def _rope_scaling(rope: Mapping[str, Any], path: Path) -> dict[str, Any]:
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return {}
    if kind not in ("llama3", "linear"):
        raise DataError(f"{path}: RoPE scaling {kind!r} is not supported; loopline reads "
                        "'llama3' and 'linear'")
    return {"rope_type": kind, **{k: v for k, v in rope.items() if k not in ("rope_type", "type")}}


def _check_architecture(arch: str, where: Any) -> None:
    if arch in SUPPORTED_ARCHITECTURES:
        return
    why = f" ({REFUSED[arch]})" if arch in REFUSED else ""
    raise DataError(f"{where}: architecture {arch!r} is not supported{why}; loopline imports "
                    f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def _gguf_arch(path: Path) -> SourceArch:
    from ..data.gguf_metadata import read_gguf_header

    fields, tensor_names = read_gguf_header(path, tensor_names=True)
    name = str(fields.get("general.architecture", "?"))
    if name not in GGUF_ARCHITECTURES:
        raise DataError(f"{path}: GGUF architecture {name!r} is not supported; loopline imports "
                        f"{', '.join(sorted(GGUF_ARCHITECTURES))} GGUF files")
    arch = GGUF_ARCHITECTURES[name]

    def key(k: str, default: Any = None) -> Any:
        value = fields.get(f"{name}.{k}", default)
        if value is None:
            raise DataError(f"{path}: GGUF metadata lacks {name}.{k}; the file is incomplete")
        return value

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    tokens = fields.get("tokenizer.ggml.tokens")
    vocab = fields.get(f"{name}.vocab_size") or getattr(tokens, "length", 0)
    rope: dict[str, Any] = {}
    if fields.get(f"{name}.rope.scaling.type") == "linear":
        rope = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    if int(fields.get(f"{name}.rope.dimension_count", hidden // heads)) != hidden // heads:
        raise DataError(f"{path}: rope.dimension_count differs from the head width; partial "
                        "rotary embeddings are not supported")
    return SourceArch(
        architecture=arch, vocab_size=int(vocab), hidden_size=hidden,
        layers=int(key("block_count")), heads=heads,
        kv_heads=int(fields.get(f"{name}.attention.head_count_kv") or heads),
        intermediate_size=int(key("feed_forward_length")),
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(fields.get(f"{name}.rope.freq_base", 10000.0)), rope_scaling=rope,
        tie_embeddings="output.weight" not in tensor_names,
        max_positions=int(fields.get(f"{name}.context_length", 2048)))


def _check_expressible(arch: SourceArch, source: Path) -> None:
    if arch.heads % arch.kv_heads:
        raise DataError(f"{source}: {arch.heads} attention heads are not a multiple of "
                        f"{arch.kv_heads} key/value heads; the checkpoint is malformed")
    if arch.hidden_size % arch.heads or arch.head_dim % 2:
        raise DataError(f"{source}: hidden size {arch.hidden_size} / {arch.heads} heads is not "
                        "an even integer head width; loopline's RoPE needs one")


# --------------------------------------------------------------------------- layer choice


@dataclass(frozen=True)
class LayerChoice:
    """Which pretrained layers (half-open [start, end) ranges) become prelude, core, coda."""

    prelude: tuple[int, int]
    core: tuple[int, int]
    coda: tuple[int, int]

    @classmethod
    def whole(cls, layers: int) -> LayerChoice:
        """Every layer in order as the core: with one loop, the original model."""
        return cls((0, 0), (0, layers), (layers, layers))

    def layers(self, part: str) -> list[int]:
        start, end = getattr(self, part)
        return list(range(start, end))

    def counts(self) -> dict[str, int]:
        return {"prelude_layers": len(self.layers("prelude")),
                "core_layers": len(self.layers("core")),
                "coda_layers": len(self.layers("coda"))}

    def as_lists(self) -> dict[str, list[int]]:
        return {part: list(getattr(self, part)) for part in ("prelude", "core", "coda")}


def parse_range(text: str | Sequence[int], option: str) -> tuple[int, int]:
    """``"A:B"`` or ``[A, B]`` → (A, B)."""
    if isinstance(text, str):
        match = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
        if not match:
            raise ConfigError(f"{option} = {text!r} is not a layer range; write START:END "
                              "(half-open, e.g. 0:4)")
        return int(match.group(1)), int(match.group(2))
    values = list(text)
    if len(values) != 2 or not all(isinstance(v, int) and v >= 0 for v in values):
        raise ConfigError(f"{option} = {values!r} is not a layer range; give [start, end] "
                          "(half-open, e.g. [0, 4])")
    return int(values[0]), int(values[1])


def layer_choice(layers: int, prelude: Any = None, core: Any = None, coda: Any = None, *,
                 where: str = "--") -> LayerChoice:
    """The checked choice: ranges in order (prelude ≤ core ≤ coda), inside [0, layers), a
    non-empty core; none given = :meth:`LayerChoice.whole`. Gaps are allowed (dropped layers)."""
    if prelude is None and core is None and coda is None:
        return LayerChoice.whole(layers)
    parts = {}
    for name, value, default in (("prelude", prelude, (0, 0)), ("core", core, None),
                                 ("coda", coda, (layers, layers))):
        if value is None and default is None:
            raise ConfigError(f"{where}core is missing; give the looped layers as START:END "
                              f"(of the source's {layers} layers)")
        parts[name] = default if value is None else parse_range(value, f"{where}{name}")
    for name, (start, end) in parts.items():
        if not 0 <= start <= end <= layers:
            raise ConfigError(f"{where}{name} = {start}:{end} is out of range; the source has "
                              f"layers 0:{layers} (half-open ranges, start <= end)")
    if parts["core"][0] == parts["core"][1]:
        raise ConfigError(f"{where}core = {parts['core'][0]}:{parts['core'][1]} is empty; the "
                          "looped core needs at least one layer")
    order = [("prelude", "core"), ("core", "coda"), ("prelude", "coda")]
    for a, b in order:
        if parts[a][1] > parts[b][0] and parts[a][0] < parts[a][1] and parts[b][0] < parts[b][1]:
            raise ConfigError(f"{where}{a} = {parts[a][0]}:{parts[a][1]} overlaps or follows "
                              f"{where}{b} = {parts[b][0]}:{parts[b][1]}; ranges must be "
                              "disjoint and in the order prelude, core, coda")
    return LayerChoice(parts["prelude"], parts["core"], parts["coda"])


# --------------------------------------------------------------------------- loopline's model section


def model_fields(arch: SourceArch, choice: LayerChoice) -> dict[str, Any]:
    """The ``model`` config keys a checkpoint fixes (the rest stay the user's: loops,
    injection, state_init, recurrence, step_embedding, attention, loss_chunk_size)."""
    rope = arch.rope_scaling
    fields: dict[str, Any] = {
        "vocab_size": arch.vocab_size, "d_model": arch.hidden_size, "n_heads": arch.heads,
        "n_kv_heads": 0 if arch.kv_heads == arch.heads else arch.kv_heads,
        "ffn_hidden": arch.intermediate_size, "moe_experts": 0,
        "norm_eps": arch.rms_norm_eps, "rope_theta": arch.rope_theta,
        "tie_embeddings": arch.tie_embeddings, **choice.counts(),
        "rope_scaling": rope.get("rope_type", "none"),
    }
    if rope:
        fields["rope_scaling_factor"] = float(rope.get("factor", 1.0))
    if rope.get("rope_type") == "llama3":
        fields.update(rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                      rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
                      rope_original_max_position=int(rope.get(
                          "original_max_position_embeddings", 8192)))
    return fields
