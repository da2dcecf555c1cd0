"""param_count (pure arithmetic) equals the real model's parameter count; config checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.model.looped import LoopedLM
from pipeline_lib.spec.config_model import ModelConfig
from pipeline_lib.spec.size import (
    check_model_config,
    param_count,
    resolved_ffn_hidden,
    resolved_moe_hidden,
)

CONFIGS = [
    {},
    {"prelude_layers": 0, "coda_layers": 0, "tie_embeddings": False},
    {"moe_experts": 4, "moe_top_k": 2, "core_layers": 2},
    {"moe_experts": 3, "moe_top_k": 1, "moe_ffn_hidden": 24, "ffn_hidden": 40},
    {"injection": "linear", "step_embedding": True, "loops": 5, "learned_positions": 12},
    {"learn_injection_scale": True, "coda_layers": 3, "d_model": 24, "n_heads": 3},
    {"moe_experts": 3, "moe_top_k": 3, "d_model": 64, "n_heads": 4},  # 176 / 3 = 58 → 64
    {"d_model": 48, "n_heads": 6, "n_kv_heads": 2, "tie_embeddings": False},  # grouped-query
    {"n_kv_heads": 1, "moe_experts": 2, "moe_top_k": 1},  # multi-query
    {"n_kv_heads": 2},  # = n_heads: plain multi-head
    {"exit_gate": True, "coda_layers": 0},  # the shared exit gate: d + 1
    # pretrained families: q/k/v biases (Qwen2), QK-norm gains per head (Qwen3) or over all
    # heads (OLMo-2), heads wider or narrower than d_model / n_heads
    {"qkv_bias": True, "n_kv_heads": 1},
    {"qk_norm": "head", "head_dim": 24, "n_kv_heads": 1},
    {"qk_norm": "all_heads", "norm_placement": "post", "head_dim": 8, "d_model": 24,
     "n_heads": 4, "n_kv_heads": 2},
    {"d_model": 30, "n_heads": 4, "head_dim": 6},  # d_model not a multiple of n_heads
    {"recurrence": "gated", "loops": 4},  # gates g_2 … g_4
    {"recurrence": "gated", "loops": 1},  # one gate for test-time loops
]


@pytest.mark.parametrize("overrides", CONFIGS)
def test_param_count_equals_real_model(overrides, make_config):
    cfg = make_config(**overrides)
    model = LoopedLM(cfg)
    assert param_count(cfg) == sum(p.numel() for p in model.parameters())


def test_default_widths(make_config):
    cfg = make_config(d_model=128, n_heads=4)
    assert resolved_ffn_hidden(cfg) == 352  # 8/3·128 = 341.3 → next multiple of 16
    assert resolved_moe_hidden(make_config(d_model=128, n_heads=4, moe_experts=8)) == 176


def test_expert_widths_are_rounded_up_to_aligned_rows(make_config):
    """Grouped GEMM needs 16-byte rows: 8 elements in bf16 (a width of 58 broke it)."""
    derived = make_config(d_model=64, n_heads=4, moe_experts=4, moe_top_k=3)
    assert resolved_ffn_hidden(derived) // 3 == 58 and resolved_moe_hidden(derived) == 64
    assert resolved_moe_hidden(make_config(moe_experts=4, moe_ffn_hidden=58)) == 64
    assert resolved_moe_hidden(make_config(moe_experts=4, moe_ffn_hidden=24)) == 24
    assert LoopedLM(derived).core[0].ffn.w_gate.shape == (4, 64, 64)


def test_size_module_does_not_import_torch():
    code = ("import sys; from pipeline_lib.spec.size import param_count; "
            "from pipeline_lib.spec.config_model import ModelConfig; "
            "from pipeline_lib.model.loop_sampling import sample_loop_count; "
            "print(param_count(ModelConfig(vocab_size=260)), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    count, torch_loaded = out.stdout.split()
    assert torch_loaded == "False"
    assert int(count) == param_count(ModelConfig(vocab_size=260))


@pytest.mark.parametrize("overrides, match", [
    ({"vocab_size": 0}, "model.vocab_size = 0"),
    ({"d_model": 18, "n_heads": 4}, "not divisible by model.n_heads"),
    ({"d_model": 18, "n_heads": 6}, "must be even for RoPE"),
    ({"head_dim": 7}, "model.head_dim = 7 must be even"),
    ({"qk_norm": "rms"}, "model.qk_norm = 'rms' is not allowed"),
    ({"norm_placement": "sandwich"}, "model.norm_placement = 'sandwich'"),
    ({"moe_experts": 2, "moe_top_k": 3}, "model.moe_top_k = 3"),
    ({"d_model": 24, "n_heads": 4, "n_kv_heads": 3}, "model.n_kv_heads = 3 does not divide"),
    ({"n_kv_heads": 4}, "model.n_kv_heads = 4 does not divide model.n_heads = 2"),
    ({"n_kv_heads": -1}, "model.n_kv_heads = -1 must not be negative"),
    ({"rope_scaling": "yarn"}, "model.rope_scaling = 'yarn' is not allowed"),
    ({"rope_scaling": "llama3", "rope_high_freq_factor": 1.0}, "must exceed"),
    ({"injection": "concat"}, "model.injection = 'concat'"),
    ({"loops": 0}, "model.loops = 0"),
])
def test_impossible_configs_raise_config_error(overrides, match, make_config):
    cfg = make_config(**overrides)
    with pytest.raises(ConfigError, match=match):
        check_model_config(cfg)
    with pytest.raises(ConfigError, match=match):
        LoopedLM(cfg)


def _linear_weights(module) -> int:
    import torch

    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("overrides", [{}, {"injection": "linear", "tie_embeddings": False},
                                       {"d_model": 32, "n_heads": 4, "n_kv_heads": 1},
                                       {"head_dim": 24, "n_kv_heads": 1, "qkv_bias": True}])
def test_flops_per_token_counts_every_matmul_weight(overrides, make_config):
    from pipeline_lib.spec.size import flops_per_token

    cfg = make_config(loops=3, **overrides)
    model = LoopedLM(cfg)
    blocks = [*model.prelude, *model.coda] + [b for b in model.core for _ in range(cfg.loops)]
    weights = sum(_linear_weights(b) for b in blocks) + cfg.vocab_size * cfg.d_model
    weights += cfg.loops * _linear_weights(model.injection_proj) if model.injection_proj else 0
    attention = len(blocks) * 4 * 64 * cfg.n_heads * model.core[0].attn.head_dim
    assert flops_per_token(cfg, seq_len=64) == 2 * weights + attention


def test_flops_per_token_iso_compute_and_known_value(make_config):
    from pipeline_lib.spec.size import flops_per_token

    loop4 = ModelConfig(vocab_size=100, d_model=32, n_heads=2, prelude_layers=0, coda_layers=0,
                        core_layers=1, loops=4, ffn_hidden=64)
    deep4 = ModelConfig(vocab_size=100, d_model=32, n_heads=2, prelude_layers=0, coda_layers=0,
                        core_layers=4, loops=1, ffn_hidden=64)
    # per block: 4·32² + 3·32·64 = 10240 weights; head 3200; attention 4·128·32 per block
    assert flops_per_token(loop4, 128) == 2 * (4 * 10240 + 3200) + 4 * 4 * 128 * 32 == 153856
    assert flops_per_token(deep4, 128) == flops_per_token(loop4, 128)
    assert param_count(deep4) > param_count(loop4)
    assert flops_per_token(loop4, 128, loops=1) == 2 * (10240 + 3200) + 4 * 128 * 32
    moe = ModelConfig(vocab_size=100, d_model=32, n_heads=2, prelude_layers=0, coda_layers=0,
                      core_layers=1, loops=4, moe_experts=8, moe_top_k=2, moe_ffn_hidden=16)
    # MoE counts the router (8·32) and the 2 experts a token uses (2·3·32·16), not all 8
    assert flops_per_token(moe, 128) == 153856 + 2 * 4 * (8 * 32 + 2 * 3 * 32 * 16 - 3 * 32 * 64)
    with pytest.raises(ConfigError, match="loops >= 1"):
        flops_per_token(loop4, 128, loops=0)
