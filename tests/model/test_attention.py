"""Document-causal attention: the dense mask, packed vs alone, kernel choice (FlexAttention
itself: tests/model/test_flex.py)."""

from __future__ import annotations

import torch
from support.gqa_helpers import grouped_kv_grad, repeated_kv

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


def test_grouped_query_projection_holds_q_then_k_then_v_heads():
    attn = Attention(32, 4, 2)  # hd 8: 4 q heads, 2 k heads, 2 v heads
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (4, 2, 8)
    assert attn.qkv.weight.shape == ((4 + 2 + 2) * 8, 32)
    assert Attention(32, 4).qkv.weight.shape == (3 * 32, 32)  # 0 = n_heads: plain multi-head


def test_grouped_query_attention_equals_multi_head_with_repeated_kv_heads():
    """Packed documents, prefill path: the output equals (bit for bit where SDPA allows) the
    KV = H module whose k/v heads are the grouped ones repeated per group, and the input
    gradient agrees; the grouped weight's gradient is the repeated one's summed per group."""
    torch.manual_seed(0)
    gqa, mha = Attention(32, 4, 2), Attention(32, 4)
    with torch.no_grad():
        mha.qkv.weight.copy_(repeated_kv(gqa.qkv.weight, 4, 2))
        mha.out.weight.copy_(gqa.out.weight)
    lengths = [5, 9, 6]
    pos = torch.cat([torch.arange(n) for n in lengths])[None].expand(2, -1)
    doc = torch.cat([torch.full((n,), d) for d, n in enumerate(lengths)])[None].expand(2, -1)
    rope, mask = rope_tables(pos, 8, 10000.0), DocumentMask.build(doc, "sdpa")
    x = torch.randn(2, sum(lengths), 32, requires_grad=True)
    y_gqa = gqa(x, rope, mask)
    (dx_gqa,) = torch.autograd.grad(y_gqa.square().sum(), x)
    y_mha = mha(x, rope, mask)
    (dx_mha,) = torch.autograd.grad(y_mha.square().sum(), x)
    torch.testing.assert_close(y_gqa, y_mha, atol=1e-6, rtol=0)
    torch.testing.assert_close(dx_gqa, dx_mha, atol=1e-5, rtol=1e-6)
    gqa(x, rope, mask).square().sum().backward()
    mha(x, rope, mask).square().sum().backward()
    torch.testing.assert_close(gqa.qkv.weight.grad, grouped_kv_grad(mha.qkv.weight.grad, 4, 2),
                               atol=1e-5, rtol=1e-5)
