"""LoopedLM: one-pass multi-depth readout, document masking, unrolled/truncated backprop."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from support.gqa_helpers import as_multi_head

from pipeline_lib.model.looped import LoopedLM, LoopOutput

VARIANTS = {
    "default": {},
    "no_prelude_no_coda": {"prelude_layers": 0, "coda_layers": 0},
    "deep_coda_untied": {"prelude_layers": 2, "coda_layers": 2, "tie_embeddings": False},
    "moe": {"moe_experts": 4, "moe_top_k": 2, "core_layers": 2},
    "linear_step_emb": {"injection": "linear", "step_embedding": True, "state_init": "embedding",
                        "learned_positions": 64},
    "learned_lambda": {"learn_injection_scale": True, "injection_scale": 0.5},
    "gqa_llama3_rope": {"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "rope_scaling": "llama3",
                        "rope_scaling_factor": 8.0, "rope_original_max_position": 16},
    "gated_linear": {"recurrence": "gated", "injection": "linear"},
}


def _model(make_config, seed: int = 0, **overrides) -> LoopedLM:
    torch.manual_seed(seed)
    return LoopedLM(make_config(**overrides))


def _per_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(
        targets.shape)


@pytest.mark.parametrize("variant", VARIANTS)
def test_one_pass_readout_equals_separate_passes(variant, make_config, make_batch):
    model = _model(make_config, **VARIANTS[variant])  # cfg.loops = 3; 4 and 6 extrapolate
    batch = make_batch([[5, 7, 4], [16]])
    together = model.losses(batch, [1, 2, 4, 6])
    assert list(together) == [1, 2, 4, 6]
    for h, loss in together.items():
        alone = model.losses(batch, [h])[h]
        assert abs(loss.item() - alone.item()) <= 1e-6
        assert torch.isfinite(loss)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_parameter_gets_a_gradient(variant, make_config, make_batch):
    model = _model(make_config, **VARIANTS[variant])
    model.train()
    losses = model.losses(make_batch([[9, 7], [16]], answer_every=3), [1, 3], answer_weight=2.0)
    (losses[1] + losses[3] + model.take_aux_loss()).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert missing == []


@pytest.mark.parametrize("variant", ["default", "moe"])
def test_packed_row_gives_same_per_token_loss_as_each_document_alone(variant, make_config,
                                                                     make_batch):
    model = _model(make_config, **VARIANTS[variant])
    model.eval()
    lengths = [6, 4, 5]
    packed = make_batch([lengths], pad_to=18)  # three documents and 3 padding tokens
    got = _per_token_loss(model.logits_at(packed, 3), packed["targets"])
    start = 0
    for n in lengths:
        alone = {k: v[:, start:start + n] for k, v in packed.items()}
        alone["position_ids"] = torch.arange(n)[None]
        alone["doc_ids"] = torch.zeros(1, n, dtype=torch.long)
        ref = _per_token_loss(model.logits_at(alone, 3), alone["targets"])
        torch.testing.assert_close(got[:, start:start + n], ref, atol=1e-5, rtol=1e-5)
        start += n
    # The documents really differ from an unmasked row: without doc_ids the losses change.
    unmasked = {"input_ids": packed["input_ids"], "position_ids": packed["position_ids"]}
    changed = _per_token_loss(model.logits_at(unmasked, 3), packed["targets"])
    assert not torch.allclose(changed[:, 6:15], got[:, 6:15], atol=1e-4)


def test_losses_match_logits_and_answer_weighting(make_config, make_batch):
    model = _model(make_config)
    batch = make_batch([[7, 9], [12]], answer_every=4)
    per_token = _per_token_loss(model.logits_at(batch, 2), batch["targets"])
    valid = batch["targets"] != -100
    w = torch.where(batch["answer_mask"], 3.0, 1.0) * valid
    weighted = (per_token * w).sum() / w.sum()
    plain = per_token[valid].mean()
    torch.testing.assert_close(model.losses(batch, [2], answer_weight=3.0)[2], weighted,
                               atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(model.losses(batch, [2])[2], plain, atol=1e-6, rtol=1e-6)
    assert abs(weighted.item() - plain.item()) > 1e-4


def test_answer_only_loss_is_the_loss_restricted_to_answer_tokens(make_config, make_batch):
    batch = make_batch([[7, 9], [12]], answer_every=4)
    batch["doc_index"] = torch.zeros_like(batch["input_ids"])  # unknown keys are ignored
    valid = batch["targets"] != -100
    answer = batch["answer_mask"] & valid
    model = _model(make_config)
    got = model.losses(batch, [1, 2], answer_weight=5.0, answer_only=True)  # weight unused
    ref_model = _model(make_config)
    for h in (1, 2):
        per_token = _per_token_loss(ref_model.logits_at(batch, h), batch["targets"])
        torch.testing.assert_close(got[h], per_token[answer].mean(), atol=1e-6, rtol=1e-6)
    # Gradients too: the eager loss over the answer tokens alone.
    got[2].backward()
    ctx = ref_model.embed(batch)
    state = ref_model.forward_loops(ctx, 0, 2)
    logits = ref_model.readout_logits(state, ctx)
    F.cross_entropy(logits[answer], batch["targets"][answer]).backward()
    for (name, a), b in zip(model.named_parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5, msg=name)
    # No answer token in the batch: loss 0 and no gradient, never 0/0.
    none = {**batch, "answer_mask": torch.zeros_like(batch["answer_mask"])}
    assert model.losses(none, [2], answer_only=True)[2].item() == 0.0
    with pytest.raises(ValueError, match="answer_mask"):
        model.losses({k: v for k, v in batch.items() if k != "answer_mask"}, [2],
                     answer_only=True)


def test_logits_at_defaults_to_one_document_per_row(make_config, make_batch):
    model = _model(make_config)
    ids = make_batch([[10], [10]])["input_ids"]
    explicit = {"input_ids": ids, "position_ids": torch.arange(10).expand(2, 10),
                "doc_ids": torch.zeros(2, 10, dtype=torch.long)}
    a = model.logits_at(ids, 5)
    assert a.shape == (2, 10, model.cfg.vocab_size)
    assert torch.equal(a, model.logits_at({"input_ids": ids}, 5))
    assert torch.equal(a, model.logits_at(explicit, 5))
    by_loops = model.logits_by_loops(ids, [5, 1])
    assert torch.equal(by_loops[5], a) and not torch.equal(by_loops[1], a)


def test_forward_loops_in_segments_equals_one_run(make_config, make_batch):
    model = _model(make_config, **VARIANTS["linear_step_emb"])
    batch = make_batch([[8, 8]])
    ctx = model.embed(batch)
    whole = model.forward_loops(ctx, 0, 5)
    part = model.forward_loops(ctx, 0, 2)
    part = model.forward_loops(ctx, 2, 5, part)
    assert torch.equal(whole, part)
    one_pass = model.losses(batch, [2, 5])
    assert torch.equal(model.readout_loss(whole, ctx), one_pass[5])
    assert torch.equal(model.readout_loss(whole, batch), one_pass[5])  # context rebuilt


def test_segmented_backprop_continues_from_a_detached_state(make_config, make_batch):
    model = _model(make_config)
    batch = make_batch([[16], [6, 10]])
    first = model(batch, [1, 2])
    assert isinstance(first, LoopOutput)
    first.losses[2].backward()
    second = model(batch, [4], start=2, state=first.state.detach())
    second.losses[4].backward()
    reference = model.losses(batch, [2, 4])
    assert torch.equal(second.losses[4], reference[4])
    with pytest.raises(ValueError, match="counts > start"):
        model(batch, [2], start=2, state=first.state.detach())


def test_truncated_backprop_only_last_loops_carry_gradients(make_config, make_batch):
    model = _model(make_config)
    batch = make_batch([[16], [16]])

    def grads(loss: torch.Tensor) -> dict[str, torch.Tensor]:
        model.zero_grad()
        loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    truncated_loss = model.losses(batch, [4], no_grad_loops=3)[4]
    truncated = grads(truncated_loss)
    ctx = model.embed(batch)
    with torch.no_grad():
        state = model.forward_loops(ctx, 0, 3)
    manual_loss = model.readout_loss(model.forward_loops(ctx, 3, 4, state), ctx)
    manual = grads(manual_loss)
    full_loss = model.losses(batch, [4])[4]
    full = grads(full_loss)
    assert torch.equal(truncated_loss, manual_loss) and torch.equal(truncated_loss, full_loss)
    for name in truncated:
        torch.testing.assert_close(truncated[name], manual[name], atol=1e-7, rtol=1e-6)
    assert not torch.allclose(truncated["core.0.attn.qkv.weight"], full["core.0.attn.qkv.weight"])
    assert truncated["prelude.0.attn.qkv.weight"].any()  # e is injected in the last loop too


def test_linear_injection_starts_as_additive_injection(make_config, make_batch):
    add = _model(make_config, injection_scale=0.7)
    linear = LoopedLM(make_config(injection="linear", injection_scale=0.7))
    missing, unexpected = linear.load_state_dict(add.state_dict(), strict=False)
    assert missing == ["injection_proj.weight"] and unexpected == []
    batch = make_batch([[10, 6]])
    a, b = add.losses(batch, [1, 3]), linear.losses(batch, [1, 3])
    for h in (1, 3):
        torch.testing.assert_close(a[h], b[h], atol=1e-6, rtol=1e-6)


def test_injection_scale_learnable_or_fixed_by_config(make_config, make_batch):
    learned = _model(make_config, learn_injection_scale=True)
    assert dict(learned.named_parameters())["injection_scale"] is learned.injection_scale
    fixed = _model(make_config)
    assert "injection_scale" not in fixed.state_dict()
    batch = make_batch([[16]])
    quarter = _model(make_config, injection_scale=0.25)  # same seed: same weights, other λ
    assert quarter.injection_scale.item() == 0.25
    assert not torch.equal(fixed.losses(batch, [2])[2], quarter.losses(batch, [2])[2])


def test_same_seed_gives_bit_identical_losses_and_gradients(make_config, make_batch):
    """Also runs under torch.use_deterministic_algorithms (what the trainer turns on)."""
    batch = make_batch([[5, 11], [16]], answer_every=2)
    runs = []
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            model = _model(make_config, seed=3, **VARIANTS["moe"])
            model.train()
            losses = model.losses(batch, [1, 2, 3], answer_weight=2.0, no_grad_loops=1)
            (sum(losses.values()) + model.take_aux_loss()).backward()
            runs.append([losses[3].detach()] + [p.grad for p in model.parameters()])
    finally:
        torch.use_deterministic_algorithms(previous)
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


def test_bad_loop_lists_raise(make_config, make_batch):
    model = _model(make_config)
    batch = make_batch([[8]])
    for loops in ([], [0, 2]):
        with pytest.raises(ValueError, match="readouts must be"):
            model.losses(batch, loops)
    with pytest.raises(ValueError, match="h_eff"):
        model.logits_at(batch, 0)
    with pytest.raises(ValueError, match="targets"):
        model.readout_loss(model.forward_loops(batch, 0, 1), {"input_ids": batch["input_ids"]})


@pytest.mark.parametrize("kv_heads", [2, 1])  # grouped-query and multi-query attention
def test_grouped_query_model_equals_multi_head_model_with_repeated_kv_heads(kv_heads, make_config,
                                                                             make_batch):
    """The KV = H model whose k/v heads are the grouped model's repeated per group computes the
    same losses (every readout) and logits, over packed documents."""
    gqa = _model(make_config, d_model=32, n_heads=4, n_kv_heads=kv_heads, init_std=0.3)
    mha = LoopedLM(make_config(d_model=32, n_heads=4, init_std=0.3))
    mha.load_state_dict(as_multi_head(gqa.state_dict(), 4, kv_heads))
    batch = make_batch([[5, 7, 4], [16]])
    with torch.no_grad():
        got, want = gqa.losses(batch, [1, 3, 5]), mha.losses(batch, [1, 3, 5])
        for h in (1, 3, 5):
            torch.testing.assert_close(got[h], want[h], atol=1e-6, rtol=0)
        torch.testing.assert_close(gqa.logits_at(batch, 3), mha.logits_at(batch, 3),
                                   atol=1e-5, rtol=0)
    assert sum(p.numel() for p in gqa.parameters()) < sum(p.numel() for p in mha.parameters())


def test_learned_positions_enter_every_loop_and_refuse_positions_past_the_table(make_config):
    """The table is added to the token embedding (so e, re-injected at every loop, carries
    it): the same tokens at other positions read out differently; a document restarting its
    positions reads its first tokens as position 0; a position past the table is one line."""
    torch.manual_seed(0)
    model = LoopedLM(make_config(learned_positions=8, prelude_layers=0)).eval()
    ids = torch.randint(0, 40, (1, 8))
    with torch.no_grad():
        whole = model.logits_at(ids, 2)
        torch.nn.init.zeros_(model.pos_emb.weight)
        without = model.logits_at(ids, 2)
    assert not torch.allclose(whole, without)
    assert model.embed(ids).e.shape == (1, 8, model.cfg.d_model)
    with pytest.raises(ValueError, match="position 8 is past model.learned_positions = 8"):
        model.logits_at(torch.randint(0, 40, (1, 9)), 1)


def test_fan_in_init_draws_every_weight_matrix_within_its_fan_in_bound(make_config):
    """``init: fan_in``: blocks (MoE experts included), the untied head and the linear
    injection uniform in ±1/√fan_in, no depth scaling; embeddings keep normal(0, init_std)."""
    torch.manual_seed(0)
    cfg = make_config(init="fan_in", injection="linear", tie_embeddings=False, loops=8,
                      learned_positions=16, moe_experts=2, moe_top_k=1, core_layers=2)
    model = LoopedLM(cfg)
    mats = {n: p for n, p in model.named_parameters() if p.ndim >= 2 and "emb" not in n}
    assert {"head.weight", "injection_proj.weight", "core.0.ffn.w_down"} <= set(mats)
    for name, p in mats.items():
        bound = 1 / p.shape[1] ** 0.5
        assert p.abs().max() <= bound, name
        assert p.abs().max() > 0.9 * bound, name  # drawn over the whole range, not shrunk
    scaled = LoopedLM(replace(cfg, init="scaled"))
    assert scaled.core[0].attn.out.weight.std() < 0.5 * model.core[0].attn.out.weight.std()
    assert float(model.tok_emb.weight.std()) == pytest.approx(cfg.init_std, rel=0.2)
    assert float(model.pos_emb.weight.std()) == pytest.approx(cfg.init_std, rel=0.2)
