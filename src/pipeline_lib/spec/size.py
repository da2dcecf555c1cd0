"""Model sizes by arithmetic alone: no torch import.

The Snakefile derives the step count of a token budget from the parameter count
(tokens = parameters × multiplier), and Snakemake evaluates that on every call, dry runs
included; importing torch there would cost seconds. So the count is computed from the
config, and a test proves it equals ``sum(p.numel())`` of the real :class:`LoopedLM`.
This module also resolves the derived widths (``ffn_hidden = 0`` and friends) so the
model and the count cannot disagree, and holds the checks for impossible configs.
"""

from __future__ import annotations

from ..errors import ConfigError
from .config_model import ModelConfig
from .rules import check_model_shape


def resolved_ffn_hidden(cfg: ModelConfig) -> int:
    """Dense SwiGLU hidden width: ``ffn_hidden`` or 8/3·d_model rounded up to a multiple of 16."""
    if cfg.ffn_hidden:
        return cfg.ffn_hidden
    # ceil(8·d/3 / 16)·16 == ceil(d/6)·16, in integers to avoid float rounding.
    return -(-cfg.d_model // 6) * 16


# Expert widths are rounded up to this many elements: 16 bytes in bf16/fp16 (32 in fp32), the
# row alignment torch._grouped_mm needs (a width of 58 in bf16 makes it fail).
MOE_WIDTH_MULTIPLE = 8


def resolved_moe_hidden(cfg: ModelConfig) -> int:
    """Hidden width of one expert: ``moe_ffn_hidden`` or ffn_hidden / top_k, rounded up to a
    multiple of :data:`MOE_WIDTH_MULTIPLE`."""
    width = cfg.moe_ffn_hidden or max(1, resolved_ffn_hidden(cfg) // cfg.moe_top_k)
    return -(-width // MOE_WIDTH_MULTIPLE) * MOE_WIDTH_MULTIPLE


def resolved_kv_heads(cfg: ModelConfig) -> int:
    """Key/value heads: ``n_kv_heads``, or ``n_heads`` (plain multi-head attention) when 0."""
    return cfg.n_kv_heads or cfg.n_heads


def resolved_head_dim(cfg: ModelConfig) -> int:
    """Width of one attention head: ``head_dim``, or d_model / n_heads when 0."""
    return cfg.head_dim or cfg.d_model // cfg.n_heads


def kv_width(cfg: ModelConfig) -> int:
    """Width of the keys (and of the values) of one token: kv heads × head width."""
    return resolved_kv_heads(cfg) * resolved_head_dim(cfg)


def q_width(cfg: ModelConfig) -> int:
    """Width of the queries of one token (and of the attention output): heads × head width."""
    return cfg.n_heads * resolved_head_dim(cfg)


def step_embedding_rows(cfg: ModelConfig) -> int:
    """Rows of the per-loop step embedding (one per training loop; later loops reuse the last)."""
    return cfg.loops if cfg.step_embedding else 0


def loop_gate_rows(cfg: ModelConfig) -> int:
    """Gates of ``recurrence: gated``: one per training loop after the first (at least one;
    later loops reuse the last)."""
    return max(1, cfg.loops - 1) if cfg.recurrence == "gated" else 0


def check_model_config(cfg: ModelConfig) -> None:
    """Raise :class:`ConfigError` for a model that cannot be built.

    ``validate_config`` already rejects these when the whole config is loaded; this guard
    catches a ``ModelConfig`` built by hand (and ``vocab_size = 0``, which is legal in a
    config file but must be resolved from the packed data before a model exists).
    """
    if cfg.vocab_size < 1:
        raise ConfigError(f"model.vocab_size = {cfg.vocab_size} is not resolved; set it to the "
                          "tokenizer's vocab size (metadata.json of the packed data) before "
                          "building the model")
    for key in ("d_model", "n_heads", "core_layers", "loops", "loss_chunk_size"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"model.{key} = {getattr(cfg, key)} must be at least 1; raise it")
    for key in ("n_kv_heads", "prelude_layers", "coda_layers", "ffn_hidden", "moe_experts",
                "moe_ffn_hidden"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"model.{key} = {getattr(cfg, key)} must not be negative; use 0 or more")
    check_model_shape(cfg)
    choices = {"injection": ("add", "linear"), "state_init": ("zeros", "embedding", "noise"),
               "recurrence": ("plain", "gated"), "init": ("scaled", "fan_in"),
               "attention": ("auto", "sdpa", "flex"),
               "rope_scaling": ("none", "linear", "llama3"),
               "qk_norm": ("none", "head", "all_heads"), "norm_placement": ("pre", "post")}
    for key, allowed in choices.items():
        if getattr(cfg, key) not in allowed:
            raise ConfigError(f"model.{key} = {getattr(cfg, key)!r} is not allowed; use one of "
                              f"{list(allowed)}")


def _attention_params(cfg: ModelConfig) -> int:
    """Weights of the fused q/k/v projection (q: d×q_width, k and v: d×kv_width each) and of
    the output projection (q_width×d)."""
    d, q = cfg.d_model, q_width(cfg)
    return d * q + 2 * d * kv_width(cfg) + q * d


def _attention_vectors(cfg: ModelConfig) -> int:
    """Parameters of attention outside its matrices: q/k/v biases and QK-norm gains."""
    biases = q_width(cfg) + 2 * kv_width(cfg) if cfg.qkv_bias else 0
    gains = {"none": 0, "head": 2 * resolved_head_dim(cfg),
             "all_heads": q_width(cfg) + kv_width(cfg)}[cfg.qk_norm]
    return biases + gains


def block_param_count(cfg: ModelConfig) -> int:
    """Parameters of one transformer block (two RMSNorms, attention, dense or MoE FFN)."""
    d = cfg.d_model
    norms = 2 * d
    attention = _attention_params(cfg) + _attention_vectors(cfg)
    if cfg.moe_experts:
        ffn = cfg.moe_experts * d + cfg.moe_experts * 3 * d * resolved_moe_hidden(cfg)  # router
    else:
        ffn = 3 * d * resolved_ffn_hidden(cfg)  # SwiGLU: gate, up, down
    return norms + attention + ffn


def param_count(cfg: ModelConfig) -> int:
    """Trainable parameters of ``LoopedLM(cfg)``; equals ``sum(p.numel() for p in parameters())``.

    Buffers (MoE balancing biases, a fixed injection scale) are not parameters.
    """
    d, v = cfg.d_model, cfg.vocab_size
    n_blocks = cfg.prelude_layers + cfg.core_layers + cfg.coda_layers
    total = v * d  # token embedding
    total += 0 if cfg.tie_embeddings else v * d  # output head
    total += n_blocks * block_param_count(cfg)
    total += d  # final RMSNorm
    if cfg.injection == "linear":
        total += 2 * d * d  # W of core(W[state; e])
    elif cfg.learn_injection_scale:
        total += 1  # λ
    total += step_embedding_rows(cfg) * d
    total += cfg.learned_positions * d  # absolute position embedding
    total += loop_gate_rows(cfg)  # g_t of gated recurrence
    if cfg.exit_gate:
        total += d + 1  # the shared exit gate Linear(d, 1): weight and bias
    return total


def block_matmul_params(cfg: ModelConfig) -> int:
    """Weights one token is multiplied by in one block application: attention projections and
    the FFN (for MoE: the router and the ``moe_top_k`` experts it is routed to)."""
    d = cfg.d_model
    attention = _attention_params(cfg)  # q, k, v, out
    if cfg.moe_experts:
        ffn = cfg.moe_experts * d + cfg.moe_top_k * 3 * d * resolved_moe_hidden(cfg)
    else:
        ffn = 3 * d * resolved_ffn_hidden(cfg)
    return attention + ffn


def flops_per_token(cfg: ModelConfig, seq_len: int, loops: int | None = None) -> int:
    """Forward FLOPs per token at ``loops`` core loops (default ``cfg.loops``), by arithmetic.

    FLOPs ≈ 2 × (matmul weights used per token) + attention:

    - matmul weights: prelude and coda blocks once, the core blocks once per loop, the
      linear injection map (2·d²) once per loop, and the output head (V·d, also when tied);
      the embedding lookup, norms and elementwise ops are left out;
    - attention: 4·seq_len·d per block application (QKᵀ scores and the weighted sum of V
      over a full context, the convention of Kaplan et al. 2020 and Hoffmann et al. 2022;
      causal, document-masked rows attend to fewer tokens, so this is an upper bound).
      Grouped-query attention shares keys and values between heads but every query head
      still scores every key, so this term does not depend on ``n_kv_heads`` (with a
      ``head_dim`` other than d/heads, d is heads × head_dim here).

    A training step costs about 3× this per token (forward + backward). With this count a
    1-block × 4-loop core and a 4-block × 1-loop core cost the same, which is the point of
    comparing them (iso-compute), while their parameter counts differ.
    """
    loops = cfg.loops if loops is None else loops
    if loops < 1 or seq_len < 1:
        raise ConfigError(f"flops_per_token needs loops >= 1 and seq_len >= 1, got loops={loops}, "
                          f"seq_len={seq_len}")
    d = cfg.d_model
    applications = cfg.prelude_layers + cfg.coda_layers + cfg.core_layers * loops
    matmul = applications * block_matmul_params(cfg) + cfg.vocab_size * d
    if cfg.injection == "linear":
        matmul += loops * 2 * d * d
    return 2 * matmul + applications * 4 * seq_len * q_width(cfg)
