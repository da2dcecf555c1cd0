"""The Hugging Face families import-hf reads, and how each differs from Llama (torch-free).

Every family shares Llama's skeleton (token embedding, RMSNorm, RoPE with rotate_half,
grouped-query attention, SwiGLU, final norm, head), which :data:`.hf_layout.BLOCK_TENSORS`
maps (:func:`.hf_layout.block_tensor_names`). What a family adds or places differently is a
few model keys and a few entries of that table, written here next to what transformers
5.24's modelling code does:

- ``Qwen2ForCausalLM``: q/k/v projections with biases (``o_proj`` has none) →
  ``model.qkv_bias``; the three biases are concatenated like the weights.
- ``Qwen3ForCausalLM``: ``q_norm``/``k_norm``, RMSNorm over each head's ``head_dim``
  channels (one gain shared by the heads) after the projection, before RoPE →
  ``model.qk_norm: head``. Its ``head_dim`` (128 in the released models) need not be
  hidden / heads → ``model.head_dim`` (any family may set ``head_dim`` in config.json).
- ``Olmo2ForCausalLM``: QK-norm over the whole q projection (all heads, H·hd) and the
  whole k projection (KV·hd) → ``model.qk_norm: all_heads``; and no pre-norms: a block is
  x + post_attention_layernorm(attn(x)), then x + post_feedforward_layernorm(mlp(x)) →
  ``model.norm_placement: post``, whose gains take loopline's ``attn_norm``/``ffn_norm``
  (so OLMo-2's ``post_attention_layernorm`` is loopline's ``attn_norm``, where Llama's
  same-named tensor is the pre-FFN norm, ``ffn_norm``).

Each family also says what its config.json means where it differs from Llama's, as its
transformers config class does (read by :mod:`.source_config`): the value of a key the file
lacks (Mistral: 8 key/value heads, a 4096-token window; Qwen2/Qwen3: 32 key/value heads;
Qwen3: ``head_dim`` 128; OLMo-2: ``rms_norm_eps`` 1e-5), which bias flags its modelling
code honours (a flag the family ignores is ignored here too), and whether it has a sliding
window (Mistral: always; Qwen2/Qwen3: only when ``use_sliding_window`` is true).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _attn(*names: str) -> tuple[str, ...]:
    return tuple(f"self_attn.{n}" for n in names)


@dataclass(frozen=True)
class Family:
    """What an architecture changes in loopline's model section and block tensor table, and
    how its config.json is read."""

    model_keys: dict[str, Any] = field(default_factory=dict)
    # loopline block tensor → HF names under model.layers.{i}. (concatenated row-wise),
    # added to or replacing Llama's entry of the same loopline name
    block_tensors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # config.json key → transformers' value when the file lacks the key (an explicit null
    # is read as Llama's: heads, hidden / heads, no window)
    absent: dict[str, Any] = field(default_factory=dict)
    # config.json flags whose biases (true) loopline's blocks lack; the family's modelling
    # code reads only these
    bias_flags: tuple[str, ...] = ("attention_bias",)
    # sliding window: None = none; "always"; or the config.json flag that turns it on
    window: str | None = None


_QK_NORM = {"attn.q_norm.weight": _attn("q_norm.weight"),
            "attn.k_norm.weight": _attn("k_norm.weight")}

_QWEN = {"num_key_value_heads": 32, "sliding_window": 4096}

FAMILIES: dict[str, Family] = {
    "LlamaForCausalLM": Family(bias_flags=("attention_bias", "mlp_bias")),
    "MistralForCausalLM": Family(absent={"num_key_value_heads": 8, "sliding_window": 4096},
                                 bias_flags=(), window="always"),
    "Qwen2ForCausalLM": Family(
        {"qkv_bias": True},
        {"attn.qkv.bias": _attn("q_proj.bias", "k_proj.bias", "v_proj.bias")},
        absent=_QWEN, bias_flags=(), window="use_sliding_window"),
    "Qwen3ForCausalLM": Family({"qk_norm": "head"}, _QK_NORM,
                               absent={**_QWEN, "head_dim": 128}, window="use_sliding_window"),
    "Olmo2ForCausalLM": Family(
        {"qk_norm": "all_heads", "norm_placement": "post"},
        {**_QK_NORM, "attn_norm.weight": ("post_attention_layernorm.weight",),
         "ffn_norm.weight": ("post_feedforward_layernorm.weight",)},
        absent={"rms_norm_eps": 1e-5}),
}


def family(architecture: str) -> Family:
    """The :class:`Family` of a supported architecture (checked by the caller)."""
    return FAMILIES[architecture]

