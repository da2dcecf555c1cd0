"""Document-causal attention: masks (dense and flex), packed vs alone, kernel choice."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.model.attention import (
    Attention,
    DocumentMask,
    _flex_block_mask,
    dense_document_mask,
    resolve_attention_kernel,
)
from pipeline_lib.model.layers import rope_tables


def test_dense_mask_is_block_diagonal_causal():
    doc_ids = torch.tensor([[0, 0, 1, 1, 1, 2]])
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ], dtype=torch.bool)
    mask = dense_document_mask(doc_ids)
    assert mask.shape == (1, 1, 6, 6)
    assert torch.equal(mask[0, 0], expected)


def test_packed_attention_equals_each_document_alone():
    torch.manual_seed(0)
    attn = Attention(16, 2)
    lengths = [3, 5, 4]
    x = torch.randn(1, sum(lengths), 16)
    doc_ids = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    packed = attn(x, rope_tables(pos, 8, 10000.0), DocumentMask.build(doc_ids, "sdpa"))
    start = 0
    for n in lengths:
        alone = attn(x[:, start:start + n], rope_tables(torch.arange(n)[None], 8, 10000.0),
                     DocumentMask.build(torch.zeros(1, n, dtype=torch.long), "sdpa"))
        torch.testing.assert_close(packed[:, start:start + n], alone, atol=1e-6, rtol=1e-5)
        start += n


def test_cpu_uses_sdpa_and_flex_request_falls_back(caplog):
    cpu = torch.device("cpu")
    assert resolve_attention_kernel("auto", cpu) == "sdpa"
    assert resolve_attention_kernel("sdpa", cpu) == "sdpa"
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.model.attention"):
        assert resolve_attention_kernel("flex", cpu) == "sdpa"
    assert "needs CUDA" in caplog.text


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flex_document_block_mask_matches_dense_mask():
    """The CUDA path's mask_mod, run by uncompiled FlexAttention on the CPU, equals SDPA."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    doc_ids = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [0] * 16])
    q, k, v = torch.randn(3, 2, 2, 16, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    got = flex.flex_attention(q, k, v, block_mask=_flex_block_mask(doc_ids))
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_document_mask(doc_ids))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)
