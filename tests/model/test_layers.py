"""RMSNorm, RoPE (and its frequency scaling, against transformers' Llama), the dense SwiGLU FFN."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.model.layers import (
    NO_SCALING,
    RMSNorm,
    RopeScaling,
    SwiGLU,
    apply_rope,
    rope_inv_freq,
    rope_tables,
)

# Llama 3.1's RoPE (head_dim 128, θ 500000, factor 8 over an 8192-token pretraining context)
# and a linear 4× extension of a θ-10000 model.
LLAMA31 = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
LINEAR4 = RopeScaling("linear", 4.0)


def test_rms_norm_value():
    norm = RMSNorm(4, eps=0.0)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 1.0, 0.5]))
    x = torch.tensor([[3.0, -4.0, 0.0, 0.0]])  # rms = sqrt(25 / 4) = 2.5
    torch.testing.assert_close(norm(x), torch.tensor([[1.2, -3.2, 0.0, 0.0]]))


def test_rope_scores_depend_only_on_relative_position():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, 8, generator=gen)
    k = torch.randn(1, 1, 1, 8, generator=gen)

    def score(m: int, n: int) -> torch.Tensor:
        cos, sin = rope_tables(torch.tensor([[m, n]]), 8, 10000.0)  # [1, 2, 1, 8]
        qm = apply_rope(q, cos[:, :1], sin[:, :1])
        kn = apply_rope(k, cos[:, 1:], sin[:, 1:])
        return (qm * kn).sum()

    torch.testing.assert_close(score(5, 2), score(13, 10), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(score(0, 0), (q * k).sum())  # position 0: no rotation
    assert not torch.allclose(score(5, 2), score(5, 4))


@pytest.mark.parametrize("scaling", [NO_SCALING, LINEAR4, RopeScaling("llama3", 8.0, 1.0, 4.0, 64)])
def test_rope_table_lookup_equals_the_float64_formula(scaling):
    """Tables are computed in float64 on the CPU and looked up on the device (no float64
    there: Ascend NPUs have none); values equal the angles computed per position (the
    compiled path's), scaled or not. Unscaled, they are cos/sin of p·θ^(−i/half) in float64."""
    from pipeline_lib.model.layers import _rope_direct

    pos = torch.randint(0, 3000, (2, 50), generator=torch.Generator().manual_seed(0))
    for positions in (pos[:, :5] % 40, pos):  # a 64-row table, then a 4096-row one
        cos, sin = rope_tables(positions, 16, 10000.0, scaling)
        want_cos, want_sin = _rope_direct(positions, 16, 10000.0, scaling)
        assert cos.shape == (*positions.shape, 1, 16) and cos.dtype == torch.float32
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)
    if scaling is NO_SCALING:
        angles = pos.double()[..., None] / 10000.0 ** (torch.arange(8, dtype=torch.float64) / 8)
        assert torch.equal(cos[:, :, 0, :8], angles.cos().float())
        assert torch.equal(sin[:, :, 0, 8:], angles.sin().float())


def _hf_rotary(scaling: RopeScaling, head_dim: int, theta: float):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": {"none": "default"}.get(scaling.kind, scaling.kind), "rope_theta": theta}
    if scaling.kind != "none":
        params["factor"] = scaling.factor
    if scaling.kind == "llama3":
        params.update(low_freq_factor=scaling.low_freq_factor,
                      high_freq_factor=scaling.high_freq_factor,
                      original_max_position_embeddings=scaling.original_max_position)
    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=131072,
                                      rope_parameters=params)
    return LlamaRotaryEmbedding(config)


@pytest.mark.parametrize("scaling, head_dim, theta", [(LLAMA31, 128, 500000.0),
                                                      (LINEAR4, 64, 10000.0),
                                                      (NO_SCALING, 64, 100000.0)])
def test_rope_scaling_equals_transformers_llama(scaling, head_dim, theta):
    """Frequencies equal transformers' (``_compute_llama3_parameters``, linear) to a few fp32
    ulps (it computes in fp32, we in float64); the tables equal its LlamaRotaryEmbedding's
    cos/sin (ours: (cos ‖ cos), (−sin ‖ sin)) to the fp32 rounding of its angles p·f."""
    rotary = _hf_rotary(scaling, head_dim, theta)
    assert rotary.attention_scaling == 1.0
    ours = rope_inv_freq(head_dim, theta, scaling)
    torch.testing.assert_close(ours, rotary.inv_freq.double(), rtol=4e-7, atol=0)
    if scaling is not NO_SCALING:  # the scaling matters: not the unscaled frequencies
        assert not torch.allclose(ours, rope_inv_freq(head_dim, theta), rtol=0.1)
    wavelen = 2 * math.pi / rope_inv_freq(head_dim, theta)
    if scaling.kind == "llama3":  # every regime occurs: kept, interpolated, divided
        kept, divided = wavelen < 8192 / 4, wavelen > 8192
        assert kept.any() and divided.any() and (~kept & ~divided).any()
    positions = torch.cat([torch.arange(300), torch.arange(300, 20000, 97)])[None]
    cos, sin = rope_tables(positions, head_dim, theta, scaling)
    want_cos, want_sin = rotary(torch.zeros(1, 1, head_dim), positions)  # [1, P, head_dim]
    half = head_dim // 2
    # fp32 rounding: of the frequency (a few ulps), of p·f, of cos/sin themselves
    ulps = (positions[0, :, None].double() * ours) * 2.0 ** -21 + 2.0 ** -22
    for got, want in ((cos[:, :, 0], want_cos), (sin[:, :, 0, half:], want_sin[..., half:]),
                      (-sin[:, :, 0, :half], want_sin[..., :half])):
        err = (got.double() - want.double()).abs()[0]
        assert (err <= ulps.repeat(1, got.shape[-1] // half)).all()


def test_rms_norm_equals_transformers_llama_in_fp32():
    """Llama's RMSNorm (fp32 variance, gain applied after the cast back) and F.rms_norm agree
    in fp32 (here bit for bit; bf16 rounds once more in Llama's, a 1-ulp difference)."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    gen = torch.Generator().manual_seed(0)
    ours, theirs = RMSNorm(576, 1e-5), LlamaRMSNorm(576, 1e-5)
    with torch.no_grad():
        gain = 1 + 0.3 * torch.randn(576, generator=gen)
        ours.weight.copy_(gain), theirs.weight.copy_(gain)
    x = 3 * torch.randn(4, 33, 576, generator=gen)
    torch.testing.assert_close(ours(x), theirs(x), atol=1e-6, rtol=1e-6)


def test_swiglu_value():
    torch.manual_seed(0)
    ffn = SwiGLU(6, 10)
    x = torch.randn(2, 3, 6)
    ref = (F.silu(x @ ffn.gate.weight.T) * (x @ ffn.up.weight.T)) @ ffn.down.weight.T
    torch.testing.assert_close(ffn(x), ref)


def test_apply_rope_is_the_pairwise_rotation_bit_for_bit():
    """The tables' (cos ‖ cos), (−sin ‖ sin) form computes (x1·cos − x2·sin, x2·cos + x1·sin)
    exactly: the same products and sums, in fewer operations."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 3, 16, generator=gen)
    pos = torch.randint(0, 500, (2, 7), generator=gen)
    cos, sin = rope_tables(pos, 16, 10000.0)
    c, s = cos[..., :8], sin[..., 8:]  # the plain cos, sin of the angles
    assert torch.equal(sin[..., :8], -s) and torch.equal(cos[..., 8:], c)
    x1, x2 = x.chunk(2, dim=-1)
    want = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    assert torch.equal(apply_rope(x, cos, sin), want)
