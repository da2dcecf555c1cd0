"""What loopline knows of Hugging Face checkpoints, in one table (import side).

Torch-free and cheap: the Snakefile plans a ``model.init_from`` run from these tables on
every call. A source is read and checked by :mod:`.pretrained_source` (its config by
:mod:`.source_config`); the weights themselves are loaded by the import engine,
:mod:`~pipeline_lib.retrofit.hf_import`.

Sources: a Hugging Face model directory (``config.json`` + safetensors, sharded or not) or a
GGUF file (metadata read by the ``gguf`` package). Supported: ``LlamaForCausalLM``
(SmolLM/SmolLM2, TinyLlama, Llama 2, Llama 3 with its RoPE scaling), ``MistralForCausalLM``,
``Qwen2ForCausalLM`` (q/k/v biases), ``Qwen3ForCausalLM`` (per-head QK-norm, its own
``head_dim``) and ``Olmo2ForCausalLM`` (QK-norm over all heads, post-norm blocks); what each
family changes is in :mod:`.hf_archs`. GGUF files: Llama and Mistral.

Conventions, and where each is handled:

- loopline fuses q, k and v into one projection ``attn.qkv`` whose output rows are all q
  heads, then all k heads, then all v heads: HF's ``q_proj``, ``k_proj``, ``v_proj`` weights
  concatenated row-wise in that order (:data:`BLOCK_TENSORS`).
- RoPE: HF Llama rotates (x_i, x_{i+d/2}) pairs ("rotate_half"), as loopline does, so HF
  weights are used as they are. llama.cpp rotates adjacent pairs (x_{2i}, x_{2i+1}) and its
  converter permutes the rows of q and k within each head to match; GGUF's q and k rows are
  permuted back by :func:`~pipeline_lib.retrofit.hf_import.unpermute_rows` (the exactness
  tests catch a wrong inverse).
- GQA: ``num_key_value_heads`` → ``model.n_kv_heads``; query head i reads kv head
  i // (heads / kv_heads), in HF and in loopline.
- ``head_dim`` in config.json other than hidden_size / heads → ``model.head_dim`` (else 0).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .hf_archs import FAMILIES, family

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM"}
# architecture → why it is refused (named in the error)
REFUSED = {"GemmaForCausalLM": "its norms scale by 1 + weight, its embeddings by "
                               "sqrt(hidden_size) and its FFN is GeGLU, none of which loopline's "
                               "blocks do"}

# loopline block tensor → (HF tensor names under model.layers.{i}., GGUF names under blk.{i}.);
# several names are concatenated row-wise (dim 0) in the order given. Llama's; the other
# families' differences: block_tensor_names.
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


def block_tensor_names(architecture: str, gguf: bool) -> dict[str, tuple[str, ...]]:
    """loopline block tensor → the source's names (under the layer prefix) that make it:
    :data:`BLOCK_TENSORS` with the family's differences (:mod:`.hf_archs`)."""
    if gguf:
        return {ours: names for ours, (_, names) in BLOCK_TENSORS.items()}
    return {**{ours: names for ours, (names, _) in BLOCK_TENSORS.items()},
            **family(architecture).block_tensors}


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
    tie_embeddings: bool  # no separate output head: the embedding is the head
    max_positions: int
    sliding_window: int | None = None  # Mistral, Qwen: attention reaches this many tokens back
    explicit_head_dim: int = 0  # config.json's head_dim where it is not hidden / heads

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.heads


def source_tensor_shapes(arch: SourceArch, gguf: bool) -> dict[str, tuple[int, ...]]:
    """Every tensor a source of ``arch`` must hold (its names in the source, HF or GGUF)
    with the shape its config implies, in torch order ([out, in]; GGUF dims reversed): the
    family's block tensors (:func:`block_tensor_names`: Qwen2's q/k/v biases, the QK-norm
    gains of Qwen3 and OLMo-2, OLMo-2's post-norms) included."""
    d, hd, ffn = arch.hidden_size, arch.head_dim, arch.intermediate_size
    q, kv = arch.heads * hd, arch.kv_heads * hd
    per_head = family(arch.architecture).model_keys.get("qk_norm") == "head"
    block = {"input_layernorm.weight": (d,), "self_attn.q_proj.weight": (q, d),
             "self_attn.k_proj.weight": (kv, d), "self_attn.v_proj.weight": (kv, d),
             "self_attn.o_proj.weight": (d, q), "post_attention_layernorm.weight": (d,),
             "mlp.gate_proj.weight": (ffn, d), "mlp.up_proj.weight": (ffn, d),
             "mlp.down_proj.weight": (d, ffn), "self_attn.q_proj.bias": (q,),
             "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,),
             "self_attn.q_norm.weight": (hd,) if per_head else (q,),
             "self_attn.k_norm.weight": (hd,) if per_head else (kv,),
             "post_feedforward_layernorm.weight": (d,)}
    top = {"model.embed_tokens.weight": (arch.vocab_size, d), "model.norm.weight": (d,),
           "lm_head.weight": (arch.vocab_size, d)}
    pick = 1 if gguf else 0
    out = {names[pick]: top[names[0]] for ours, names in TOP_TENSORS.items()
           if not (ours == "head.weight" and arch.tie_embeddings)}
    prefix = gguf_block_prefix if gguf else hf_block_prefix
    # GGUF holds Llama and Mistral only, whose block tensors are BLOCK_TENSORS'
    to_gguf = {h: g for hs, gs in BLOCK_TENSORS.values() for h, g in zip(hs, gs, strict=True)}
    for names in block_tensor_names(arch.architecture, gguf=False).values():
        for hf_name in names:
            for layer in range(arch.layers):
                out[prefix(layer) + (to_gguf[hf_name] if gguf else hf_name)] = block[hf_name]
    return out


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
        return {f"{part}_layers": len(self.layers(part)) for part in ("prelude", "core", "coda")}

    def as_lists(self) -> dict[str, list[int]]:
        return {part: list(getattr(self, part)) for part in ("prelude", "core", "coda")}

    def check(self, layers: int, where: str = "--") -> LayerChoice:
        """This choice, when a source of ``layers`` layers can be imported with it: ranges
        inside [0, layers), in order (prelude ≤ core ≤ coda, gaps allowed: dropped layers)
        and a non-empty core; else a ConfigError naming ``{where}{part}``. The one check of a
        layer choice: import-hf, the planner and retrofit-plan's candidates all pass it."""
        parts = {"prelude": self.prelude, "core": self.core, "coda": self.coda}
        for name, (start, end) in parts.items():
            if not 0 <= start <= end <= layers:
                raise ConfigError(f"{where}{name} = {start}:{end} is out of range; the source "
                                  f"has layers 0:{layers} (half-open ranges, start <= end)")
        if self.core[0] == self.core[1]:
            raise ConfigError(f"{where}core = {self.core[0]}:{self.core[1]} is empty; the "
                              "looped core needs at least one layer")
        for a, b in [("prelude", "core"), ("core", "coda"), ("prelude", "coda")]:
            (a0, a1), (b0, b1) = parts[a], parts[b]
            if a1 > b0 and a0 < a1 and b0 < b1:
                raise ConfigError(f"{where}{a} = {a0}:{a1} overlaps or follows {where}{b} = "
                                  f"{b0}:{b1}; ranges must be disjoint and in the order "
                                  "prelude, core, coda")
        return self


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
    """The parsed choice, checked (:meth:`LayerChoice.check`); none given =
    :meth:`LayerChoice.whole`, an omitted prelude or coda is empty."""
    if prelude is None and core is None and coda is None:
        return LayerChoice.whole(layers)
    if core is None:
        raise ConfigError(f"{where}core is missing; give the looped layers as START:END "
                          f"(of the source's {layers} layers)")
    parts = [default if value is None else parse_range(value, f"{where}{name}")
             for name, value, default in (("prelude", prelude, (0, 0)), ("core", core, None),
                                          ("coda", coda, (layers, layers)))]
    return LayerChoice(*parts).check(layers, where)


def init_choice(init: Any, layers: int) -> LayerChoice:
    """The checked layer choice of ``model.init_from`` (an ``InitFromConfig``) for a source
    of ``layers`` layers; none named: the whole model as one core."""
    return layer_choice(layers, init.prelude or None, init.core or None, init.coda or None,
                        where="model.init_from.")


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
        "rope_scaling": rope.get("rope_type", "none"), "head_dim": arch.explicit_head_dim,
        "qkv_bias": False, "qk_norm": "none", "norm_placement": "pre",
        **family(arch.architecture).model_keys,
    }
    if rope:  # every key checked present by .source_config (as transformers requires)
        fields["rope_scaling_factor"] = rope["factor"]
    if rope.get("rope_type") == "llama3":
        fields.update(rope_low_freq_factor=rope["low_freq_factor"],
                      rope_high_freq_factor=rope["high_freq_factor"],
                      rope_original_max_position=rope["original_max_position_embeddings"])
    return fields
