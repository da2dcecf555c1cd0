"""RMSNorm, RoPE and the dense SwiGLU FFN."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pipeline_lib.model.layers import RMSNorm, SwiGLU, apply_rope, rope_tables


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


def test_rope_table_lookup_equals_the_float64_formula():
    """Tables are computed in float64 on the CPU and looked up on the device (no float64
    there: Ascend NPUs have none); values equal the angles computed per position."""
    from pipeline_lib.model.layers import _rope_direct

    pos = torch.randint(0, 3000, (2, 50), generator=torch.Generator().manual_seed(0))
    for positions in (pos[:, :5] % 40, pos):  # a 64-row table, then a 4096-row one
        cos, sin = rope_tables(positions, 16, 10000.0)
        want_cos, want_sin = _rope_direct(positions, 16, 10000.0)
        assert cos.shape == (*positions.shape, 1, 16) and cos.dtype == torch.float32
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


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
