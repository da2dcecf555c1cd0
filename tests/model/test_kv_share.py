"""KV sharing across loops (``kv_share``): slots, bytes and what a decoded token reads."""

from __future__ import annotations

import pytest
import torch

from pipeline_lib.errors import ConfigError
from pipeline_lib.model.kv_cache import attention_calls, share_every
from pipeline_lib.model.looped import LoopedLM

H = 4


@pytest.fixture
def model(make_config) -> LoopedLM:
    torch.manual_seed(5)
    return LoopedLM(make_config(init_std=0.3, core_layers=2, n_heads=4, n_kv_heads=2)).eval()


def _prompt() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(1, 48, (2, 7), generator=torch.Generator().manual_seed(2))
    return ids, torch.tensor([7, 5])


def _decode(model: LoopedLM, cache, logits: torch.Tensor, steps: int, hook=None) -> list:
    out = [logits]
    for _ in range(steps):
        if hook is not None:
            hook(cache)
        out.append(model.decode_step(cache, out[-1].argmax(-1)))
    return out


def test_per_loop_is_the_default_bit_for_bit_and_one_slot_per_call(model) -> None:
    ids, lengths = _prompt()
    default = model.prefill(ids, H, lengths)
    per_loop = model.prefill(ids, H, lengths, kv_share="per_loop")
    assert len(per_loop[1].keys) == attention_calls(model.cfg, H)
    a, b = _decode(model, default[1], default[0], 5), _decode(model, per_loop[1], per_loop[0], 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(torch.equal(x, y) for x, y in zip(default[1].keys, per_loop[1].keys, strict=True))


@pytest.mark.parametrize(("share", "every"), [("last", H), ("every:2", 2), ("every:3", 3)])
def test_shared_slots_read_each_groups_last_loop(model, share: str, every: int) -> None:
    """A shared cache decodes like a per-loop cache whose slots hold, at every earlier
    column, the keys and values of the last loop of their group."""
    ids, lengths = _prompt()
    logits, shared = model.prefill(ids, H, lengths, kv_share=share)
    ref_logits, ref = model.prefill(ids, H, lengths)
    assert torch.equal(logits, ref_logits)  # the prompt itself is computed exactly
    P, C = model.cfg.prelude_layers, model.cfg.core_layers
    groups = -(-H // every)
    assert len(shared.keys) == P + groups * C + model.cfg.coda_layers

    @torch.inference_mode()
    def fill(cache) -> None:  # earlier columns: each loop reads its group's last loop
        for t in range(H):
            last = min((t // every + 1) * every, H) - 1
            for j in range(C):
                for buf in (cache.keys, cache.values):
                    buf[P + t * C + j].copy_(buf[P + last * C + j])

    got = _decode(model, shared, logits, 6)
    want = _decode(model, ref, ref_logits, 6, hook=fill)
    for x, y in zip(got, want, strict=True):
        assert (x - y).abs().max() <= 1e-5
    per_slot = shared.keys[0].numel() * shared.keys[0].element_size() * 2
    assert shared.nbytes == per_slot * len(shared.keys)
    core_ratio = (ref.nbytes - shared.nbytes) / per_slot  # core slots saved
    assert core_ratio == (H - groups) * C
    assert shared.nbytes_core == per_slot * groups * C
    assert ref.nbytes_core == per_slot * H * C
    assert shared.nbytes - shared.nbytes_core == ref.nbytes - ref.nbytes_core  # prelude, coda


def test_last_keeps_one_hth_of_the_core_bytes_and_the_total_ratio_is_documented(model) -> None:
    """``last`` at H loops: core bytes exactly 1/H of ``per_loop``'s, also after decoding
    grew the buffers; the total is (P + C + Q)/(P + H·C + Q) of it."""
    ids, lengths = _prompt()
    caches = {}
    for share in ("per_loop", "last"):
        logits, cache = model.prefill(ids, H, lengths, kv_share=share)
        _decode(model, cache, logits, 9)  # past the prefill's capacity: buffers doubled
        caches[share] = cache
    full, last = caches["per_loop"], caches["last"]
    assert last.capacity == full.capacity > ids.shape[1]
    assert last.nbytes_core * H == full.nbytes_core
    P, C, Q = model.cfg.prelude_layers, model.cfg.core_layers, model.cfg.coda_layers
    assert last.nbytes * (P + H * C + Q) == full.nbytes * (P + C + Q)


def test_last_changes_what_decoded_tokens_see(model) -> None:
    ids, lengths = _prompt()
    logits, per_loop = model.prefill(ids, H, lengths)
    _, shared = model.prefill(ids, H, lengths, kv_share="last")
    token = logits.argmax(-1)
    assert not torch.allclose(model.decode_step(per_loop, token), model.decode_step(shared, token))


@pytest.mark.parametrize("bad", ["every:0", "every:", "every:-1", "first", "every:x"])
def test_bad_kv_share_names_the_flag_and_the_values(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--kv-share .*per_loop, last or every:K"):
        share_every(bad, H)


def test_share_every_values() -> None:
    assert (share_every("per_loop", 8), share_every("last", 8), share_every("every:3", 8)) == \
        (1, 8, 3)
