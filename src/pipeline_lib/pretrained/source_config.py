"""The config of a pretrained source as a typed view, each key read and checked once.

An HF directory's ``config.json`` or a GGUF file's metadata becomes a
:class:`~.hf_layout.SourceArch`. Every value loopline uses passes one checked accessor of
:class:`SourceKeys`, so a missing key or a value of the wrong type or range is one
:class:`~pipeline_lib.errors.DataError` naming the file and its key
(``…/config.json: num_attention_heads = 0 must be an integer >= 1; …``): never a bare
``KeyError`` or ``ZeroDivisionError``, and never an error under loopline's ``model.*`` keys,
which the user did not set. Options whose meaning transformers gives and loopline's blocks
cannot reproduce are refused here too (see docs/pretrained.md). Torch-free: the planner
reads a source through this on every Snakemake call. The tensors are checked by
:mod:`.pretrained_source`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from ..errors import DataError
from ..spec.names import CONFIG_JSON
from .hf_archs import family
from .hf_layout import (
    GGUF_ARCHITECTURES,
    REFUSED,
    SUPPORTED_ARCHITECTURES,
    SourceArch,
)

_REQUIRED = object()
DAMAGED = "the file is damaged or not the config of a supported model; download the model again"
LLAMA3_KEYS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


class SourceKeys:
    """Checked reads of a source's config: ``where`` is the file, ``prefix`` the keys' own
    prefix (``llama.`` for GGUF metadata, ``rope_parameters.`` for a nested object)."""

    def __init__(self, values: Mapping[str, Any], where: Path | str, prefix: str = ""):
        self.values, self.where, self.prefix = values, where, prefix

    def fail(self, key: str, value: Any, problem: str, fix: str = DAMAGED) -> NoReturn:
        shown = (f"[{value.length} values]" if hasattr(value, "length") else
                 json.dumps(value) if isinstance(value, bool) else repr(value))  # JSON's true
        raise DataError(f"{self.where}: {self.prefix}{key} = {shown} {problem}; {fix}")

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        """The value (``None`` = absent); ``default`` when absent, missing without one."""
        value = self.values.get(self.prefix + key)
        if value is None:
            if default is _REQUIRED:
                raise DataError(f"{self.where}: {self.prefix}{key} is missing; {DAMAGED}")
            return default
        return value

    def _checked(self, key: str, default: Any, ok: Any, problem: str) -> Any:
        """The value if ``ok(value)``, the default (trusted, unchecked) when absent."""
        if self.values.get(self.prefix + key) is None:
            return self.raw(key, default)
        value = self.values[self.prefix + key]
        if not ok(value):
            self.fail(key, value, problem)
        return value

    def integer(self, key: str, default: Any = _REQUIRED, *, minimum: int = 1) -> Any:
        return self._checked(key, default, lambda v: isinstance(v, int) and not isinstance(
            v, bool) and v >= minimum, f"must be an integer >= {minimum}")

    def number(self, key: str, default: Any = _REQUIRED) -> Any:
        """A finite number > 0 (as a float)."""
        value = self._checked(key, default, lambda v: isinstance(v, int | float) and not
                              isinstance(v, bool) and math.isfinite(v) and v > 0,
                              "must be a finite number > 0")
        return None if value is None else float(value)

    def flag(self, key: str, default: bool) -> bool:
        return self._checked(key, default, lambda v: isinstance(v, bool), "must be true or false")

    def text(self, key: str, default: Any = _REQUIRED) -> Any:
        return self._checked(key, default, lambda v: isinstance(v, str), "must be a string")


# --------------------------------------------------------------------------- config.json


def read_config_json(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_JSON
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"model source {directory} has no {CONFIG_JSON}; pass a Hugging Face "
                        "model directory (save_pretrained writes one)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path} is not readable JSON ({str(exc).splitlines()[0]}); download "
                        "the model again") from None
    if not isinstance(config, dict):
        raise DataError(f"{path} holds a JSON {type(config).__name__}, not an object; "
                        f"{DAMAGED}")
    return config


def hf_arch(directory: Path, config: dict[str, Any] | None = None) -> SourceArch:
    """The architecture in ``directory/config.json`` (``config``: that file, read already),
    every key checked; a key the file lacks takes its family's transformers default
    (:attr:`.hf_archs.Family.absent`: e.g. Mistral's 4096-token sliding window and 8
    key/value heads, Qwen3's head_dim 128)."""
    config = read_config_json(directory) if config is None else config
    keys = SourceKeys(config, directory / CONFIG_JSON)
    archs = keys.raw("architectures", None) or [keys.text("model_type", "?")]
    if not (isinstance(archs, list) and isinstance(archs[0], str)):
        keys.fail("architectures", archs, "must be a list of model class names (e.g. "
                  '["LlamaForCausalLM"])')
    arch = archs[0]
    check_architecture(arch, keys.where)
    fam = family(arch)

    def absent(key: str, otherwise: Any) -> Any:  # the family's value when the file lacks key
        return otherwise if key in config else fam.absent.get(key, otherwise)

    hidden, heads = keys.integer("hidden_size"), keys.integer("num_attention_heads")
    kv_heads = keys.integer("num_key_value_heads", absent("num_key_value_heads", heads))
    head_dim = keys.integer("head_dim", absent("head_dim", None))
    explicit = 0 if head_dim is None or head_dim * heads == hidden else head_dim
    check_heads(keys, ("hidden_size", "num_attention_heads", "num_key_value_heads"),
                hidden, heads, kv_heads, explicit)
    _check_hf_options(keys, fam.bias_flags)
    theta, rope = _hf_rope(keys)
    window = None
    if fam.window == "always" or (fam.window and keys.flag(fam.window, False)):
        window = keys.integer("sliding_window", absent("sliding_window", None))
    return SourceArch(
        architecture=arch, vocab_size=keys.integer("vocab_size"), hidden_size=hidden,
        layers=keys.integer("num_hidden_layers"), heads=heads, kv_heads=kv_heads,
        intermediate_size=keys.integer("intermediate_size"),
        rms_norm_eps=keys.number("rms_norm_eps", absent("rms_norm_eps", 1e-6)),
        rope_theta=theta, rope_scaling=rope,
        tie_embeddings=keys.flag("tie_word_embeddings", False),
        max_positions=keys.integer("max_position_embeddings", 2048), sliding_window=window,
        explicit_head_dim=explicit)


def _check_hf_options(keys: SourceKeys, bias_flags: tuple[str, ...]) -> None:
    """Options of the HF config that loopline's blocks cannot express; ``bias_flags``: the
    bias flags the family's modelling code reads (:attr:`.hf_archs.Family.bias_flags`)."""
    act = keys.text("hidden_act", "silu")
    if act != "silu":
        keys.fail("hidden_act", act, "is not supported", "loopline's FFN is SwiGLU (silu) only")
    for key in bias_flags:
        if keys.flag(key, False):
            keys.fail(key, True, "is not supported", "loopline's output and FFN projections "
                      "have no biases (only Qwen2's q/k/v biases are read)")


def _hf_rope(keys: SourceKeys) -> tuple[float, dict[str, Any]]:
    """(θ, scaling) from ``rope_parameters`` (transformers 5) or ``rope_scaling``; a scaling
    lacking a key transformers requires is refused as transformers refuses it."""
    name = "rope_parameters" if keys.values.get("rope_parameters") else "rope_scaling"
    rope = keys.raw(name, {})
    if not isinstance(rope, dict):
        keys.fail(name, rope, "must be an object")
    nested = SourceKeys({f"{name}.{k}": v for k, v in rope.items()}, keys.where, f"{name}.")
    theta = nested.number("rope_theta", None) or keys.number("rope_theta", 10000.0)
    for where in (keys, nested):
        if where.raw("partial_rotary_factor", 1.0) != 1.0:
            where.fail("partial_rotary_factor", where.raw("partial_rotary_factor"),
                       "is not supported", "loopline rotates the whole head")
    kind = nested.text("rope_type", None) or nested.text("type", "default")
    if kind == "default":
        return theta, {}
    if kind not in ("llama3", "linear"):
        nested.fail("rope_type", kind, "is not supported", "loopline reads RoPE scaling "
                    "'llama3' and 'linear'")
    required = ("factor",) + (LLAMA3_KEYS if kind == "llama3" else ())
    for key in required:  # transformers refuses a scaling without these; so does loopline
        if rope.get(key) is None:
            raise DataError(f"{keys.where}: {name}.{key} is missing for RoPE scaling {kind!r}, "
                            "which transformers refuses too; add it (the model card gives the "
                            "value) or use a complete config.json")
    out: dict[str, Any] = {"rope_type": kind, "factor": nested.number("factor")}
    if kind == "llama3":
        out.update(low_freq_factor=nested.number("low_freq_factor"),
                   high_freq_factor=nested.number("high_freq_factor"),
                   original_max_position_embeddings=nested.integer(
                       "original_max_position_embeddings"))
        if out["high_freq_factor"] <= out["low_freq_factor"]:
            nested.fail("high_freq_factor", out["high_freq_factor"], "must exceed "
                        f"low_freq_factor = {out['low_freq_factor']} (llama3 scaling)")
    return theta, out


def check_architecture(arch: str, where: Any) -> None:
    if arch in SUPPORTED_ARCHITECTURES:
        return
    why = f" ({REFUSED[arch]})" if arch in REFUSED else ""
    raise DataError(f"{where}: architecture {arch!r} is not supported{why}; loopline imports "
                    f"{', '.join(SUPPORTED_ARCHITECTURES)}")


def check_heads(keys: SourceKeys, names: tuple[str, str, str], hidden: int, heads: int,
                kv_heads: int, head_dim: int = 0) -> None:
    """Heads a multiple of the key/value heads, an even integer head width (loopline's RoPE):
    ``head_dim`` if the config sets one other than hidden / heads, else hidden / heads;
    ``names``: the source's keys of hidden size, heads and key/value heads."""
    if heads % kv_heads:
        keys.fail(names[1], heads, f"is not a multiple of {keys.prefix}{names[2]} = {kv_heads}")
    if head_dim:
        if head_dim % 2:
            keys.fail("head_dim", head_dim, "is not an even head width", "loopline's RoPE "
                      "needs one; such models are not supported")
    elif hidden % heads or (hidden // heads) % 2:
        keys.fail(names[0], hidden, f"/ {keys.prefix}{names[1]} = {heads} is not an even "
                  "integer head width", "loopline's RoPE needs one; such models are not "
                  "supported")


# --------------------------------------------------------------------------- GGUF metadata


def gguf_arch(path: Path, fields: Mapping[str, Any], tensor_names: set[str]) -> SourceArch:
    """The architecture in a GGUF file's metadata (``fields``), every key checked."""
    name = fields.get("general.architecture", "?")
    if name not in GGUF_ARCHITECTURES:
        raise DataError(f"{path}: GGUF architecture {name!r} is not supported; loopline imports "
                        f"{', '.join(sorted(GGUF_ARCHITECTURES))} GGUF files")
    keys = SourceKeys(fields, path, f"{name}.")
    hidden, heads = keys.integer("embedding_length"), keys.integer("attention.head_count")
    kv_heads = keys.integer("attention.head_count_kv", heads)
    check_heads(keys, ("embedding_length", "attention.head_count", "attention.head_count_kv"),
                hidden, heads, kv_heads)
    other_width = ("loopline's GGUF import derives the head width; import the model's "
                   "Hugging Face directory instead (it reads head_dim)")
    for key, fix in (("rope.dimension_count", "loopline rotates the whole head; such models "
                      "are not supported"),
                     ("attention.key_length", other_width),
                     ("attention.value_length", other_width)):
        if keys.integer(key, hidden // heads) != hidden // heads:
            keys.fail(key, keys.raw(key), f"differs from the head width {hidden // heads}", fix)
    if keys.integer("expert_count", 0, minimum=0):
        keys.fail("expert_count", keys.raw("expert_count"), "is not supported",
                  "mixture-of-experts models (Mixtral) are not imported")
    rope: dict[str, Any] = {}
    kind = keys.text("rope.scaling.type", "none")
    if kind == "linear":
        rope = {"rope_type": "linear", "factor": keys.number("rope.scaling.factor")}
    elif kind != "none":
        keys.fail("rope.scaling.type", kind, "is not supported", "loopline reads linear "
                  "RoPE scaling from GGUF; import the Hugging Face directory instead")
    tokens = fields.get("tokenizer.ggml.tokens")
    vocab = keys.integer("vocab_size", getattr(tokens, "length", None))
    if vocab is None:
        keys.raw("vocab_size")  # neither the key nor a token list: missing
    return SourceArch(
        architecture=GGUF_ARCHITECTURES[name], vocab_size=vocab, hidden_size=hidden,
        layers=keys.integer("block_count"), heads=heads, kv_heads=kv_heads,
        intermediate_size=keys.integer("feed_forward_length"),
        rms_norm_eps=keys.number("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=keys.number("rope.freq_base", 10000.0), rope_scaling=rope,
        tie_embeddings="output.weight" not in tensor_names,
        max_positions=keys.integer("context_length", 2048))
