"""Document-causal attention: the dense mask, packed vs alone, kernel choice (FlexAttention
itself: tests/model/test_flex.py)."""

from __future__ import annotations

import torch

from pipeline_lib.model.attention import (
    Attention,
    DocumentMask,
    dense_document_mask,
    resolve_attention_kernel,
)
from pipeline_lib.model.flex import reset_flex_decision
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


def test_kernel_choice_by_request_and_device():
    """``auto`` is SDPA off CUDA; ``flex`` builds flex masks anywhere (the first call decides)."""
    reset_flex_decision()
    cpu = torch.device("cpu")
    assert resolve_attention_kernel("auto", cpu) == "sdpa"
    assert resolve_attention_kernel("sdpa", cpu) == "sdpa"
    assert resolve_attention_kernel("flex", cpu) == "flex"
    mask = DocumentMask.build(torch.zeros(2, 40, dtype=torch.long), "flex")
    assert mask.flex_len == 256 and mask.block_mask.seq_lengths == (256, 256)
    assert mask.block_mask.kv_num_blocks.device == cpu  # built where the batch lives
