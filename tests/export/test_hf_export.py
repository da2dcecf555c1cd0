"""The Hugging Face export of a snapshot: its files, loading it with transformers alone (no
loopline importable), logits equal to LoopedLM's at H_eff 1, 4 and 8 for dense, MoE and
grouped-query (Llama 3 RoPE, gated loops, noise state) models, ``generate(num_loops=…)``
equal to loopline's greedy decoding, its KV cache equal to recomputing the window, sharded
snapshots exporting the same weights as unsharded ones, and config.json files of older
exports still loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.export_helpers import (
    SEQ_LEN,
    random_model,
    run_hf_worker,
    write_model_snapshot,
    write_sharded_model_snapshot,
)

from pipeline_lib.data.tokenizer import byte_level_tokenizer
from pipeline_lib.evaluate.generation import Depth, generate_texts
from pipeline_lib.export import export_snapshot
from pipeline_lib.export.hf import EXPORT_FILES, MODELING_FILES

H_EFFS = [1, 4, 8]
ROPE_KEYS = ("rope_scaling_type", "rope_scaling_factor", "rope_low_freq_factor",
             "rope_high_freq_factor", "rope_original_max_position")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[torch.nn.Module, Path, Path]]:
    """name → (model, its snapshot, its export) for the dense, the MoE and the GQA model."""
    root = tmp_path_factory.mktemp("exports")
    tok = byte_level_tokenizer()
    out = {}
    for name in ("dense", "moe", "gqa"):
        model = random_model(name)
        snap = write_model_snapshot(root / name / "snapshots" / "step_0000005", model, tok)
        export_snapshot(snap, root / name / "export")
        out[name] = (model, snap, root / name / "export")
    return out


def test_export_holds_the_hf_files_and_the_loop_count(exports) -> None:
    model, snap, out = exports["moe"]
    assert sorted(p.name for p in out.iterdir()) == sorted(EXPORT_FILES)
    config = json.loads((out / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "modeling_loopline.LooplineConfig",
                                  "AutoModelForCausalLM": "modeling_loopline.LooplineForCausalLM"}
    assert (config["model_type"], config["num_loops"], config["max_position_embeddings"]) == (
        "loopline", 3, SEQ_LEN)
    assert (config["moe_experts"], config["moe_top_k"], config["injection"]) == (4, 2, "linear")
    assert config["loopline"] == {"snapshot": str(snap.resolve()), "step": 5, "weights": "model",
                                  "train_loops": 3, "seq_len": SEQ_LEN}
    assert json.loads((out / "generation_config.json").read_text()) == {
        "eos_token_id": 256, "pad_token_id": 257, "do_sample": False, "use_cache": True}
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["split_special_tokens"] is True
    here = Path(__import__("pipeline_lib.export.hf").export.hf.__file__)
    for name in MODELING_FILES:  # copies that know nothing of loopline
        assert (out / name).read_text() == here.with_name(name).read_text()
        assert "pipeline_lib" not in (out / name).read_text().replace(
            "python -m pipeline_lib export", "")
    weights = load_file(str(out / "model.safetensors"))
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    dense = load_file(str(exports["dense"][2] / "model.safetensors"))
    assert "head.weight" not in dense  # tied: the head is the token embedding
    assert dense["injection_scale"].item() == pytest.approx(
        exports["dense"][0].injection_scale.item())



def test_grouped_query_export_names_its_kv_heads_and_rope_scaling(exports) -> None:
    _, _, out = exports["gqa"]
    config = json.loads((out / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert {k: config[k] for k in ROPE_KEYS} == {
        "rope_scaling_type": "llama3", "rope_scaling_factor": 4.0, "rope_low_freq_factor": 1.0,
        "rope_high_freq_factor": 4.0, "rope_original_max_position": 64}
    weights = load_file(str(out / "model.safetensors"))
    assert weights["core.0.attn.qkv.weight"].shape == ((4 + 2 * 2) * 8, 32)
    dense = json.loads((exports["dense"][2] / "config.json").read_text())
    assert (dense["num_key_value_heads"], dense["rope_scaling_type"]) == (2, "none")


@pytest.mark.parametrize("scaling", [{}, {"rope_scaling": "linear", "rope_scaling_factor": 3.0},
                                     {"rope_scaling": "llama3", "rope_scaling_factor": 8.0,
                                      "rope_low_freq_factor": 2.0, "rope_high_freq_factor": 8.0,
                                      "rope_original_max_position": 200}])
def test_the_exported_rope_tables_equal_loopline_s(scaling) -> None:
    """The modelling file's own RoPE, read from config.json's keys, gives loopline's tables
    bit for bit (at head width 32 every llama3 regime occurs over a 200-token context)."""
    from pipeline_lib.export import modeling_loopline as exported
    from pipeline_lib.export.hf import hf_config
    from pipeline_lib.model.layers import RopeScaling, rope_tables
    from pipeline_lib.spec.config import Config

    cfg = Config()
    for key, value in {"vocab_size": 258, "d_model": 64, "n_heads": 2, **scaling}.items():
        setattr(cfg.model, key, value)
    config = exported.LooplineConfig(**hf_config(cfg, 256, 257, {}))
    positions = torch.randint(0, 5000, (2, 40), generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(positions, 32, cfg.model.rope_theta, RopeScaling.of(cfg.model))
    got_cos, got_sin = exported.rope_tables(positions, config)  # plain cos, sin [B, L, 1, 16]
    assert torch.equal(got_cos, cos[..., :16]) and torch.equal(got_sin, sin[..., 16:])


def test_a_config_json_from_before_gqa_and_rope_scaling_loads_as_before(exports) -> None:
    """An export written before num_key_value_heads and the rope_* keys existed: multi-head
    attention, unscaled RoPE, its weights fit."""
    from pipeline_lib.export import modeling_loopline as exported

    _, _, out = exports["dense"]
    config = json.loads((out / "config.json").read_text())
    for key in ("num_key_value_heads", *ROPE_KEYS):
        config.pop(key)
    old = exported.LooplineConfig(**config)
    assert (old.num_key_value_heads, old.rope_scaling_type) == (2, "none")
    model = exported.LooplineForCausalLM(old)
    result = model.load_state_dict(load_file(str(out / "model.safetensors")), strict=False)
    assert (result.missing_keys, result.unexpected_keys) == ([], [])


@pytest.mark.slow
def test_transformers_alone_loads_the_export_with_loopline_logits(exports, tmp_path) -> None:
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(3))
    request = {"exports": [{"dir": str(out), "ids": ids.tolist(), "loops": H_EFFS,
                            "generate": {"prompt": "a=1;b=", "loops": 4, "max_new": 6}}
                           for _, _, out in exports.values()]}
    answer = run_hf_worker(request, tmp_path)
    assert answer["pipeline_lib_modules"] == []  # loopline was never imported
    tok = byte_level_tokenizer()
    for (name, (model, _, _)), got in zip(exports.items(), answer["answers"], strict=True):
        assert got["class"] == "LooplineForCausalLM"
        assert (got["missing"], got["unexpected"]) == ([], [])
        assert got["config_loops"] == model.cfg.loops
        for h in H_EFFS:
            torch.testing.assert_close(torch.tensor(got["logits"][str(h)]),
                                       model.logits_at(ids, h), atol=1e-5, rtol=0,
                                       msg=f"{name} at H_eff {h}")
        torch.testing.assert_close(torch.tensor(got["default_logits"]),
                                   model.logits_at(ids, model.cfg.loops), atol=1e-5, rtol=0)
        [ours] = generate_texts(model, tok, ["a=1;b="], context_len=SEQ_LEN, max_new_tokens=6,
                                depth=Depth(4))
        assert got["prompt_ids"] == tok.encode("a=1;b=").ids
        assert got["generated_text"] == ours.text, name
        assert got["generated_ids"][:len(ours.ids)] == ours.ids and len(ours.ids) == 6


@pytest.mark.slow
def test_the_exports_kv_cache_generates_what_recomputing_the_window_does(exports,
                                                                        tmp_path) -> None:
    """transformers' generate() with the export's own cache (LoopKVCache) against
    use_cache=False on left-padded rows: the same tokens greedy (at the training loop count,
    fewer and more), with beam search (the cache reorders) and seeded sampling; the cached
    steps' logits equal one forward pass over the finished sequences within 1e-5."""
    loops = [4, 1, 7]
    request = {"exports": [{"dir": str(out), "ids": [[1, 2]], "loops": [],
                            "cache": {"prompts": ["a=1;b=", "x=12;y=3;z=a;"], "loops": loops,
                                      "max_new": 10}}
                           for _, _, out in exports.values()]}
    answer = run_hf_worker(request, tmp_path)
    assert answer["pipeline_lib_modules"] == []
    for name, got in zip(exports, answer["answers"], strict=True):
        cache = got["cache"]
        assert cache["identical"] == {**{f"greedy_{h}": True for h in loops}, "beam": True,
                                      "sample": True}, name
        assert cache["cache_class"] == "LoopKVCache"
        assert cache["cached_tokens"] == 13 + 10 - 1  # the last token is never fed back
        assert cache["max_logit_diff"] <= 1e-5, name


def test_sharded_snapshot_exports_the_weights_of_its_unsharded_twin(exports, tmp_path) -> None:
    model, _, unsharded = exports["moe"]
    snap = write_sharded_model_snapshot(tmp_path / "snapshots" / "step_0000005", model,
                                        byte_level_tokenizer())
    assert (snap / "model_dcp").is_dir() and not (snap / "model.safetensors").exists()
    export_snapshot(snap, tmp_path / "export")
    a = load_file(str(tmp_path / "export" / "model.safetensors"))
    b = load_file(str(unsharded / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    twin = json.loads((unsharded / "config.json").read_text())
    assert config.pop("loopline")["snapshot"] == str(snap.resolve())
    twin.pop("loopline")
    assert config == twin


def test_a_pretrained_tokenizer_exports_its_own_specials_and_document_bos(tmp_path) -> None:
    """The exported tokenizer starts a text the way the pack started documents (its BOS),
    with the tokenizer's own EOS/pad names (a pretrained vocabulary has no <|pad|>)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from pipeline_lib.data.tokenizer import set_document_start
    from pipeline_lib.export.hf import tokenizer_files

    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<unk>": 2}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    set_document_start(tok, 3)
    for name, text in tokenizer_files(tok, SEQ_LEN).items():
        (tmp_path / name).write_text(text)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    specials = (config["bos_token"], config["eos_token"], config["pad_token"])
    assert specials == ("<s>", "</s>", "</s>")
    assert config["add_bos_token"] is True
    hf = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    assert hf.encode("a b a") == [3, 0, 1, 0]
    assert hf.encode("a b", add_special_tokens=False) == [0, 1]
    set_document_start(tok, None)
    plain = json.loads(tokenizer_files(tok, SEQ_LEN)["tokenizer_config.json"])
    assert plain["add_bos_token"] is False and "bos_token" not in plain
