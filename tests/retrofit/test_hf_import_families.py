"""import-hf beyond Llama: Qwen2 (q/k/v biases), Qwen3 (per-head QK-norm), OLMo-2 (QK-norm
over all heads, post-norm blocks) and heads whose width is not hidden / heads, each built by
transformers on a tiny random config (``save_pretrained``). Imported with every layer in
order and one loop, the snapshot gives transformers' logits; exported again to the Hugging
Face format, the exported model gives them too (in process here, and loaded by transformers
alone in a process without loopline in the slow test). With ``model.recurrence: gated`` the
import and its export are the source at every loop count."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from support.export_helpers import run_hf_worker
from support.hf_import_helpers import FAMILIES, save_tiny_llama

from pipeline_lib.errors import DataError
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.export import export_snapshot
from pipeline_lib.pretrained.hf_layout import layer_choice, model_fields
from pipeline_lib.pretrained.init import resolve_init_from
from pipeline_lib.pretrained.pretrained_source import read_source
from pipeline_lib.retrofit.hf_import import import_checkpoint
from pipeline_lib.spec.config import Config
from pipeline_lib.spec.config_load import config_from_dict

IDS = torch.tensor([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66],
                    [3, 200, 17, 99, 255, 0, 1, 2, 45, 46, 47, 48, 49, 50, 51, 52]])

# name → (family, config overrides, the model keys the import must set); hidden 64, 4 heads
SOURCES = {
    "qwen2": ("qwen2", {"num_key_value_heads": 1},
              {"qkv_bias": True, "qk_norm": "none", "norm_placement": "pre", "head_dim": 0}),
    "qwen3_wide_heads": ("qwen3", {"head_dim": 24},
                         {"qkv_bias": False, "qk_norm": "head", "head_dim": 24}),
    "olmo2": ("olmo2", {}, {"qk_norm": "all_heads", "norm_placement": "post", "head_dim": 0}),
    "olmo2_narrow_heads": ("olmo2", {"head_dim": 8, "num_key_value_heads": 4},
                           {"qk_norm": "all_heads", "norm_placement": "post", "head_dim": 8}),
    "llama_wide_heads": ("llama", {"head_dim": 24}, {"qk_norm": "none", "head_dim": 24}),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """name → (source directory, transformers model, imported snapshot, its HF export)."""
    out = {}
    for name, (family, overrides, _) in SOURCES.items():
        root = tmp_path_factory.mktemp(name)
        hf = save_tiny_llama(root / "source", seed=len(out), family=family, **overrides)
        for key, p in hf.named_parameters():  # biases and QK-norm gains away from their init
            if key.endswith(("bias", "q_norm.weight", "k_norm.weight")):
                assert p.abs().sum() > 0 and not torch.all(p == 1), key
        import_checkpoint(root / "source", root / "snap", Config())
        export_snapshot(root / "snap", root / "export")
        out[name] = (root / "source", hf, root / "snap", root / "export")
    return out


def _hf_logits(hf, ids=IDS):
    with torch.no_grad():
        return hf(ids).logits


def _scale_close(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Max abs difference relative to the logit scale (max |logit|)."""
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.mark.parametrize("name", list(SOURCES))
def test_the_import_sets_the_family_s_model_keys(sources, name):
    """In the snapshot's config and in a ``model.init_from`` run's model section, whatever
    the config said for them."""
    source, want = sources[name][0], SOURCES[name][2]
    fields = model_fields(read_source(source).arch, layer_choice(4))
    assert {k: fields[k] for k in want} == want
    model = load_for_eval(sources[name][2]).model
    assert {k: getattr(model.cfg, k) for k in want} == want
    cfg, _ = resolve_init_from(config_from_dict({
        "data": {"tokenizer": {"type": "file", "path": str(source)}},
        "model": {"init_from": {"source": str(source)}, "head_dim": 32, "qkv_bias": True,
                  "qk_norm": "all_heads", "norm_placement": "post"}}))
    assert {k: getattr(cfg.model, k) for k in want} == want


@pytest.mark.parametrize("name", list(SOURCES))
def test_whole_model_at_one_loop_gives_the_hf_logits(sources, name):
    _, hf, snap, _ = sources[name]
    model = load_for_eval(snap).model
    assert _scale_close(model.logits_at(IDS, 1), _hf_logits(hf)) <= 1e-4


@pytest.mark.parametrize("name", ["qwen2", "qwen3_wide_heads", "olmo2"])
def test_prelude_core_coda_in_order_and_packed_rows_stay_exact(sources, name, tmp_path):
    """Split into prelude/core/coda, two documents packed in one row: each document's own
    HF logits (positions restart, attention stays inside the document)."""
    source, hf, _, _ = sources[name]
    choice = layer_choice(4, "0:1", "1:3", "3:4")
    import_checkpoint(source, tmp_path / "snap", Config(), choice)
    model = load_for_eval(tmp_path / "snap").model
    a, b = IDS[0, :9], IDS[1, :7]
    batch = {"input_ids": torch.cat([a, b])[None],
             "position_ids": torch.cat([torch.arange(9), torch.arange(7)])[None],
             "doc_ids": torch.tensor([0] * 9 + [1] * 7)[None]}
    theirs = torch.cat([_hf_logits(hf, a[None])[0], _hf_logits(hf, b[None])[0]])
    assert _scale_close(model.logits_at(batch, 1)[0], theirs) <= 1e-4


@pytest.mark.parametrize("name", list(SOURCES))
def test_the_hf_export_of_an_import_gives_the_source_logits(sources, name):
    """The export's config.json names the family's options, and its modelling file (loaded
    here in process) reproduces the source's logits."""
    from pipeline_lib.export import modeling_loopline as exported

    _, hf, snap, out = sources[name]
    config = json.loads((out / "config.json").read_text())
    want = load_for_eval(snap).model.cfg
    assert (config["qkv_bias"], config["qk_norm"], config["norm_placement"]) == (
        want.qkv_bias, want.qk_norm, want.norm_placement)
    assert config["head_dim"] == (want.head_dim or 16)
    model = exported.LooplineForCausalLM(exported.LooplineConfig(**config)).eval()
    result = model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    with torch.no_grad():
        ours = model(IDS, num_loops=1).logits
    assert _scale_close(ours, _hf_logits(hf)) <= 1e-4


@pytest.mark.parametrize("name, ranges", [("qwen3_wide_heads", ()),
                                          ("olmo2", ("0:1", "1:3", "3:4"))])
def test_a_gated_import_and_its_export_are_the_source_at_every_loop_count(sources, name,
                                                                          ranges, tmp_path):
    """``model.recurrence: gated`` with 4 loops over a Qwen3 (QK-norm, wide heads) or a split
    OLMo-2 (post-norm blocks): the snapshot and its HF export give the source's logits at
    every H_eff; with the gates moved off 0 the export still equals loopline at every H_eff."""
    from pipeline_lib.export import modeling_loopline as exported

    source, hf, _, _ = sources[name]
    cfg = Config()
    cfg.model.recurrence, cfg.model.loops = "gated", 4
    import_checkpoint(source, tmp_path / "snap", cfg, layer_choice(4, *ranges))
    export_snapshot(tmp_path / "snap", tmp_path / "export")
    model = load_for_eval(tmp_path / "snap").model
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert (config["loop_gate_rows"], config["num_loops"]) == (3, 4)
    hf_model = exported.LooplineForCausalLM(exported.LooplineConfig(**config)).eval()
    result = hf_model.load_state_dict(load_file(str(tmp_path / "export" / "model.safetensors")),
                                      strict=False)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])
    loops, theirs = (1, 2, 3, 4, 6), _hf_logits(hf)
    with torch.no_grad():
        for h, ours in model.logits_by_loops(IDS, list(loops)).items():
            assert _scale_close(ours, theirs) <= 1e-4, h
            assert _scale_close(hf_model(IDS, num_loops=h).logits, theirs) <= 1e-4, h
        gates = torch.tensor([0.7, -0.4, 1.3])
        model.loop_gate.copy_(gates)
        hf_model.loop_gate.copy_(gates)
        mine = model.logits_by_loops(IDS, list(loops))
        for h in loops:
            assert _scale_close(hf_model(IDS, num_loops=h).logits, mine[h]) <= 1e-4, h
        assert _scale_close(mine[4], theirs) > 1e-3  # the moved gates do change the logits


def test_kv_cached_decoding_of_an_import_equals_the_window(sources):
    """Cached greedy decoding through QK-norm, post-norm and biased projections gives the
    logits of recomputing the whole window."""
    for name in ("qwen2", "qwen3_wide_heads", "olmo2"):
        model = load_for_eval(sources[name][2]).model
        logits, cache = model.prefill(IDS[:, :10], 1)
        step = model.decode_step(cache, IDS[:, 10])
        full = model.logits_at(IDS[:, :11], 1)
        torch.testing.assert_close(logits, full[:, 9], atol=1e-5, rtol=0, msg=name)
        torch.testing.assert_close(step, full[:, 10], atol=1e-5, rtol=0, msg=name)


@pytest.mark.slow
def test_transformers_alone_loads_the_exports_with_the_source_logits(sources, tmp_path):
    request = {"exports": [{"dir": str(out), "ids": IDS.tolist(), "loops": [1]}
                           for _, _, _, out in sources.values()]}
    answer = run_hf_worker(request, tmp_path)
    assert answer["pipeline_lib_modules"] == []
    for (name, (_, hf, _, _)), got in zip(sources.items(), answer["answers"], strict=True):
        assert (got["missing"], got["unexpected"]) == ([], []), name
        ours = torch.tensor(got["logits"]["1"])
        assert _scale_close(ours, _hf_logits(hf)) <= 1e-4, name


# --------------------------------------------------------------------------- what stays refused


@pytest.mark.parametrize("family, key", [("qwen3", "attention_bias"), ("olmo2", "attention_bias"),
                                         ("llama", "mlp_bias")])
def test_biases_beyond_qwen2_s_are_one_line_errors(sources, tmp_path, family, key):
    source = sources["qwen2"][0]
    config = json.loads((source / "config.json").read_text())
    config.update({"architectures": [FAMILIES[family][1]], key: True})
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match=f"{key} = true") as err:
        read_source(tmp_path)
    assert "\n" not in str(err.value)


def test_a_qwen_window_it_does_not_use_is_not_a_limit(sources, tmp_path):
    """Qwen's config.json names a sliding window that only ``use_sliding_window`` turns on."""
    source = sources["qwen2"][0]
    config = json.loads((source / "config.json").read_text())
    config.update(sliding_window=32, use_sliding_window=False)
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes((source / "model.safetensors").read_bytes())
    assert read_source(tmp_path).arch.sliding_window is None
    config["use_sliding_window"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert read_source(tmp_path).arch.sliding_window == 32
