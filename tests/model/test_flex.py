"""FlexAttention on the CPU: the block mask, compiled flex across lengths without recompiles,
and the once-per-process decision (a fallback warned once and tagged, never a silent switch).

torch 2.13 compiles FlexAttention on the CPU through inductor's C++ code (forward only; it has
no CPU backward), so the compile counts below are real ones. The first compile of a process
takes 5–20 s here; later ones reuse inductor's on-disk cache.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from pipeline_lib.errors import DeviceError
from pipeline_lib.model import flex
from pipeline_lib.model.attention import dense_document_mask, resolve_attention_kernel
from pipeline_lib.model.kernels import kernel_tags
from pipeline_lib.model.looped import LoopedLM

pytest.importorskip("torch.nn.attention.flex_attention")


@pytest.fixture(autouse=True)
def fresh_decision() -> Iterator[None]:
    flex.reset_flex_decision()
    yield
    flex.reset_flex_decision()


def graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


@pytest.fixture
def twins(make_config) -> tuple[LoopedLM, LoopedLM]:
    """The same weights with attention flex and sdpa."""
    torch.manual_seed(0)
    a = LoopedLM(make_config(attention="flex"))
    b = LoopedLM(make_config(attention="sdpa"))
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("lengths", [[[40], [13, 27]], [[130, 70], [200]], [[300], [1, 299]]])
def test_block_mask_equals_create_block_mask(lengths: list[list[int]], make_batch) -> None:
    from torch.nn.attention.flex_attention import create_block_mask

    doc = make_batch(lengths)["doc_ids"]
    padded = flex.pad_doc_ids(doc, flex.padded_length(doc.shape[1]))
    assert padded.shape[1] == max(256, -(-doc.shape[1] // 128) * 128)
    assert (padded[:, 1:] >= padded[:, :-1]).all()  # the padding is one more document
    ours = flex.document_block_mask(padded)
    L = padded.shape[1]
    ref = create_block_mask(lambda b, h, q, kv: (padded[b, q] == padded[b, kv]) & (kv <= q),
                            padded.shape[0], None, L, L)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                 "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert torch.equal(getattr(ours, name), getattr(ref, name)), name
    assert torch.equal(ours.to_dense(), ref.to_dense())


def test_compiled_flex_equals_sdpa_without_recompiling_across_lengths(twins, make_batch) -> None:
    model, ref = twins
    model.eval(), ref.eval()
    from torch._dynamo.utils import counters

    counters.clear()
    seen = []
    with torch.no_grad():
        for lengths in ([[40], [13, 27]], [[60, 40], [100]], [[130], [70, 60]], [[300], [5, 295]],
                        [[64], [64]]):
            batch = make_batch(lengths)
            got, want = model.logits_at(batch, 3), ref.logits_at(batch, 3)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
            seen.append(graphs())
    # the probe compiled the two graphs (static, then dynamic lengths); no length added one
    assert seen == [2, 2, 2, 2, 2]
    # room for the graphs of a process (grad modes, dtypes, head widths): past dynamo's default
    # 8, flex would run uncompiled (on an H200 the device check's ninth graph did)
    assert torch._dynamo.config.recompile_limit >= flex.FLEX_GRAPHS
    assert kernel_tags() == {"loopline.attention_kernel": "flex"}
    with torch.no_grad():  # on the CPU the batch size is static: a new one compiles once
        model.logits_at(make_batch([[50]] * 3), 3)
        model.logits_at(make_batch([[90, 90]] * 3), 3)
    assert graphs() == 3
    # the process chose flex without gradients; a training call now fails loudly, once
    model.train()
    with pytest.raises(DeviceError) as err:
        model.losses(make_batch([[40], [40]]), [1])
    assert "FlexAttention was chosen in this process without gradients" in str(err.value)
    assert str(err.value).endswith("set model.attention: sdpa")
    assert "\n" not in str(err.value)


def test_training_on_cpu_falls_back_once_with_a_warning_and_a_tag(twins, make_batch,
                                                                   caplog) -> None:
    model, ref = twins
    batch = make_batch([[20, 12], [32]])
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.model.flex"):
        for _ in range(3):
            losses, want = model.losses(batch, [1, 3]), ref.losses(batch, [1, 3])
            losses[3].backward()
            for h in (1, 3):  # the same kernel: bit for bit
                assert torch.equal(losses[h], want[h])
        flex.flex_unavailable("asked again")  # decided: no second warning, the reason stays
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "does not support backward on CPU" in warnings[0]
    assert "this process uses SDPA" in warnings[0]
    tags = kernel_tags()
    assert tags["loopline.attention_kernel"] == "sdpa"
    assert tags["loopline.attention_fallback"].startswith("probe on cpu/float32: ")
    assert resolve_attention_kernel("flex", torch.device("cpu")) == "sdpa"  # decided for good


def test_the_probe_judges_16_bit_differences_against_the_values_size() -> None:
    """bf16 gradients of the probe's objective reach ~10, where one bf16 step is 0.06: the
    tolerance is relative to the reference's largest value (absolute below 1)."""
    ref = torch.tensor([0.5, -12.0])
    assert flex._relative_diff(ref + torch.tensor([0.0, 0.0625]), ref) == pytest.approx(0.0625 / 12)
    assert flex._relative_diff(ref + torch.tensor([0.02, 0.0]), ref) == pytest.approx(0.02 / 12)
    small = torch.tensor([0.25])
    assert flex._relative_diff(small + 0.04, small) == pytest.approx(0.04)  # absolute below 1


def test_the_probe_draws_no_random_numbers() -> None:
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    q = torch.zeros(2, 2, 40, 8)
    with torch.no_grad():
        assert flex.use_flex(q, 2)
    assert torch.equal(torch.rand(3), expected)


def test_uncompiled_flex_on_the_block_mask_equals_the_dense_mask(make_batch) -> None:
    from torch.nn.attention.flex_attention import flex_attention

    doc = flex.pad_doc_ids(make_batch([[100, 60, 96], [256]])["doc_ids"], 256)
    q, k, v = torch.randn(3, 2, 2, 256, 8, generator=torch.Generator().manual_seed(0)).unbind(0)
    got = flex_attention(q, k, v, block_mask=flex.document_block_mask(doc))
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_document_mask(doc))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_uncompiled_flex_with_grouped_kv_heads_equals_sdpa(make_batch) -> None:
    """enable_gqa on the block mask: query head i reads kv head i // 2, as SDPA's."""
    from torch.nn.attention.flex_attention import flex_attention

    doc = flex.pad_doc_ids(make_batch([[100, 60, 96], [256]])["doc_ids"], 256)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 256, 8, generator=gen)
    k, v = torch.randn(2, 2, 2, 256, 8, generator=gen).unbind(0)
    got = flex_attention(q, k, v, block_mask=flex.document_block_mask(doc), enable_gqa=True)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_document_mask(doc),
                                          enable_gqa=True)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    repeated = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(
        2, 1), attn_mask=dense_document_mask(doc))
    torch.testing.assert_close(got, repeated, atol=1e-6, rtol=1e-5)


def test_compiled_flex_with_grouped_query_attention_equals_sdpa(make_config, make_batch) -> None:
    """A grouped-query model on compiled flex (its probe at 4 query and 2 kv heads) gives
    SDPA's logits, at lengths on both sides of a block."""
    torch.manual_seed(0)
    gqa = {"d_model": 32, "n_heads": 4, "n_kv_heads": 2}
    model = LoopedLM(make_config(attention="flex", **gqa)).eval()
    ref = LoopedLM(make_config(attention="sdpa", **gqa)).eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        for lengths in ([[40], [13, 27]], [[130], [70, 60]]):
            batch = make_batch(lengths)
            torch.testing.assert_close(model.logits_at(batch, 3), ref.logits_at(batch, 3),
                                       atol=2e-5, rtol=1e-5)
    assert kernel_tags() == {"loopline.attention_kernel": "flex"}
