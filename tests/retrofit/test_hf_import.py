"""import-hf: a Hugging Face Llama (directory or GGUF) becomes a loopline snapshot whose model,
with every layer in order and one loop, gives the source model's logits; layer ranges pick
prelude, core and coda; bad sources fail in one line before anything is written."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch
from support.hf_import_helpers import save_tiny_llama, write_tiny_gguf

from pipeline_lib.errors import ConfigError, DataError, UsageError
from pipeline_lib.evaluate.loading import load_for_eval
from pipeline_lib.pretrained.hf_layout import layer_choice
from pipeline_lib.pretrained.pretrained_source import read_source
from pipeline_lib.retrofit.hf_import import import_checkpoint, unpermute_rows
from pipeline_lib.spec.config import Config


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(directory, transformers model): GQA 4/2 heads, untied head, 4 layers."""
    root = tmp_path_factory.mktemp("tiny_llama")
    return root, save_tiny_llama(root)


@pytest.fixture(scope="module")
def tied_llama3(tmp_path_factory):
    """A tied-embedding Llama 3 with RoPE scaling and no GQA."""
    root = tmp_path_factory.mktemp("tiny_llama3")
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32,
            "rope_theta": 50000.0}
    return root, save_tiny_llama(root, seed=1, tie_word_embeddings=True,
                                 num_key_value_heads=4, rope_parameters=rope)


def _import(source, out, tokenizer=None, **ranges):
    arch = read_source(source).arch
    choice = layer_choice(arch.layers, ranges.get("prelude"), ranges.get("core"),
                          ranges.get("coda"))
    cfg = Config()
    if tokenizer is not None:  # a tokenizer file other than the source's
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(
            cfg.data, tokenizer=dataclasses.replace(cfg.data.tokenizer, type="file",
                                                    path=str(tokenizer))))
    record = import_checkpoint(source, out, cfg, choice, adapter=ranges.get("adapter"))
    return record, load_for_eval(out).model


def _scale_close(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    """Max abs difference relative to the logit scale (max |logit|)."""
    return float((ours - theirs).abs().max() / theirs.abs().max())


IDS = torch.tensor([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 65, 66],
                    [3, 200, 17, 99, 255, 0, 1, 2, 45, 46, 47, 48, 49, 50, 51, 52]])


@pytest.fixture(scope="module")
def sharded_mistral(tmp_path_factory):
    """A Mistral (sliding window 4096) saved in several safetensors shards."""
    root = tmp_path_factory.mktemp("tiny_mistral")
    model = save_tiny_llama(root, seed=2, mistral=True, max_shard_size="100KB",
                            sliding_window=4096)
    assert (root / "model.safetensors.index.json").is_file()
    return root, model


@pytest.fixture(scope="module")
def tied_config_with_head(tmp_path_factory):
    """config.json says tie_word_embeddings, yet the weights hold a trained lm_head:
    transformers keeps that head (it ties only equal ones), and is the reference as loaded."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("tied_with_head")
    save_tiny_llama(root, seed=3)
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
    hf = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    assert not torch.equal(hf.lm_head.weight, hf.model.embed_tokens.weight)
    return root, hf


@pytest.fixture(scope="module")
def linear_rope(tmp_path_factory):
    """RoPE with linear scaling (factor 2)."""
    root = tmp_path_factory.mktemp("linear_rope")
    rope = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    return root, save_tiny_llama(root, seed=4, rope_parameters=rope)


@pytest.mark.parametrize("fixture", ["llama", "tied_llama3", "sharded_mistral",
                                     "tied_config_with_head", "linear_rope"])
def test_whole_model_at_one_loop_gives_the_hf_logits(request, tmp_path, fixture):
    source, hf = request.getfixturevalue(fixture)
    _, model = _import(source, tmp_path / "snap")
    ours = model.logits_at(IDS, 1)
    with torch.no_grad():
        theirs = hf(IDS).logits
    assert _scale_close(ours, theirs) <= 1e-4


def test_a_mistral_within_its_sliding_window_gives_the_hf_logits(tmp_path):
    """Rows no longer than the window (data.seq_len = 16, the window's size): exact."""
    hf = save_tiny_llama(tmp_path / "src", seed=5, mistral=True, sliding_window=16)
    arch = read_source(tmp_path / "src").arch
    assert arch.sliding_window == 16
    cfg = Config()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seq_len=16))
    import_checkpoint(tmp_path / "src", tmp_path / "snap", cfg, layer_choice(arch.layers))
    model = load_for_eval(tmp_path / "snap").model
    with torch.no_grad():
        assert _scale_close(model.logits_at(IDS, 1), hf(IDS).logits) <= 1e-4


def test_packed_rows_give_each_documents_own_hf_logits(llama, tmp_path):
    """Two documents in one row (positions restart, attention stays inside each document)
    give the logits HF computes for each document alone."""
    source, hf = llama
    _, model = _import(source, tmp_path / "snap")
    a, b = IDS[0, :9], IDS[1, :7]
    batch = {"input_ids": torch.cat([a, b])[None],
             "position_ids": torch.cat([torch.arange(9), torch.arange(7)])[None],
             "doc_ids": torch.tensor([0] * 9 + [1] * 7)[None]}
    ours = model.logits_at(batch, 1)[0]
    with torch.no_grad():
        theirs = torch.cat([hf(a[None]).logits[0], hf(b[None]).logits[0]])
    assert _scale_close(ours, theirs) <= 1e-4


def test_prelude_core_coda_in_order_at_one_loop_is_still_the_original(llama, tmp_path):
    source, hf = llama
    record, model = _import(source, tmp_path / "snap", prelude="0:1", core="1:3", coda="3:4")
    assert (model.cfg.prelude_layers, model.cfg.core_layers, model.cfg.coda_layers) == (1, 2, 1)
    assert record["layers"] == {"prelude": [0, 1], "core": [1, 3], "coda": [3, 4]}
    with torch.no_grad():
        assert _scale_close(model.logits_at(IDS, 1), hf(IDS).logits) <= 1e-4


@pytest.mark.parametrize("ranges", [[], ["--prelude", "0:1", "--core", "1:3", "--coda", "3:4",
                                         "--adapter", "linear"]])
def test_gated_import_gives_the_hf_logits_at_every_loop_count(llama, tmp_path, ranges):
    """import-hf with gated recurrence and 4 loops: every H_eff 1…4 (and beyond) is the
    source model; with plain recurrence only H_eff 1 is."""
    from pipeline_lib.cli import main

    source, hf = llama
    with torch.no_grad():
        theirs = hf(IDS).logits
    for recurrence in ("gated", "plain"):
        out = tmp_path / recurrence
        assert main(["import-hf", "--source", str(source), "--out", str(out), *ranges,
                     "--loops", "4", f"model.recurrence={recurrence}", "--no-track"]) == 0
        model = load_for_eval(out).model
        assert (model.cfg.recurrence, model.cfg.loops) == (recurrence, 4)
        logits = model.logits_by_loops(IDS, [1, 2, 3, 4, 6])
        assert _scale_close(logits[1], theirs) <= 1e-4
        far = [h for h in (2, 3, 4, 6) if _scale_close(logits[h], theirs) > 1e-4]
        assert far == ([] if recurrence == "gated" else [2, 3, 4, 6]), recurrence


def test_a_retrofit_keeps_the_chosen_layers_and_drops_the_rest(llama, tmp_path):
    source, hf = llama
    record, model = _import(source, tmp_path / "snap", prelude="0:1", core="1:2", coda="3:4",
                            adapter="linear")
    sd, theirs = model.state_dict(), hf.state_dict()
    assert torch.equal(sd["coda.0.ffn.down.weight"], theirs["model.layers.3.mlp.down_proj.weight"])
    assert torch.equal(sd["core.0.attn.out.weight"], theirs["model.layers.1.self_attn.o_proj.weight"])
    assert torch.equal(sd["core.0.attn.qkv.weight"], torch.cat(
        [theirs[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"]))
    assert not any(k.startswith("core.1.") for k in sd)
    d = model.cfg.d_model  # the linear adapter starts as state + λ·e
    assert torch.equal(sd["injection_proj.weight"], torch.cat([torch.eye(d), torch.eye(d)], 1))
    full = sum(p.numel() for p in hf.parameters())
    assert record["parameters"] < full


def test_gguf_import_undoes_llama_cpps_qk_permutation(llama, tmp_path):
    """The same weights through a GGUF file (llama.cpp's names and q/k row order) give the
    HF logits; without the inverse permutation they would not."""
    source, hf = llama
    gguf_file = write_tiny_gguf(hf, tmp_path / "tiny.gguf")
    arch = read_source(gguf_file).arch
    assert (arch.heads, arch.kv_heads, arch.layers, arch.tie_embeddings) == (4, 2, 4, False)
    _, model = _import(gguf_file, tmp_path / "snap", tokenizer=source / "tokenizer.json")
    with torch.no_grad():
        theirs = hf(IDS).logits
    assert _scale_close(model.logits_at(IDS, 1), theirs) <= 1e-4


def test_a_gguf_quantization_the_reader_cannot_dequantize_is_one_line(llama, tmp_path):
    source, hf = llama
    gguf_file = write_tiny_gguf(hf, tmp_path / "q81.gguf", q8_1="blk.2.ffn_up.weight")
    with pytest.raises(DataError, match=r"blk.2.ffn_up.weight is stored as Q8_1") as err:
        _import(gguf_file, tmp_path / "snap", tokenizer=source / "tokenizer.json")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "snap").exists()


def test_unpermute_inverts_the_llama_cpp_permutation():
    from support.hf_import_helpers import _permute_like_llama_cpp

    w = torch.arange(32 * 3, dtype=torch.float32).reshape(32, 3)
    permuted = torch.from_numpy(_permute_like_llama_cpp(w.numpy(), 4))
    assert not torch.equal(permuted, w)
    assert torch.equal(unpermute_rows(permuted, 4), w)


def test_snapshot_is_verified_and_records_its_source(llama, tmp_path):
    from pipeline_lib.checkpoint.manifest import verify_snapshot

    source, _ = llama
    record, _ = _import(source, tmp_path / "snap")
    manifest = verify_snapshot(tmp_path / "snap")
    assert {"model.safetensors", "config.yaml", "tokenizer.json", "import.json"} <= set(
        manifest["files"])
    saved = json.loads((tmp_path / "snap" / "import.json").read_text())
    assert saved["fingerprint"] == record["fingerprint"]
    assert saved["architecture"] == "LlamaForCausalLM"


# --------------------------------------------------------------------------- bad input


def test_unsupported_architecture_names_the_supported_ones(llama, tmp_path):
    source, _ = llama
    bad = tmp_path / "gemma"
    bad.mkdir()
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = ["GemmaForCausalLM"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(DataError, match="LlamaForCausalLM, MistralForCausalLM, "
                       "Qwen2ForCausalLM, Qwen3ForCausalLM, Olmo2ForCausalLM") as err:
        read_source(bad)
    assert "GeGLU" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("ranges, match", [
    ({"prelude": "0:2", "core": "1:3"}, "overlaps"),
    ({"core": "2:9"}, "out of range"),
    ({"core": "3:1"}, "out of range"),
    ({"core": "2:2"}, "empty"),
    ({"prelude": "0:1"}, "core is missing"),
    ({"core": "a-b"}, "not a layer range"),
    ({"core": "2:4", "coda": "0:1"}, "overlaps or follows"),
])
def test_bad_layer_ranges_are_one_line_errors(ranges, match):
    with pytest.raises(ConfigError, match=match):
        layer_choice(4, ranges.get("prelude"), ranges.get("core"), ranges.get("coda"))


def test_a_failed_import_writes_nothing(llama, tmp_path):
    source, _ = llama
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in os.listdir(source):
        if name != "tokenizer.json":
            (broken / name).write_bytes((source / name).read_bytes())
    with pytest.raises(DataError, match="tokenizer"):
        _import(broken, tmp_path / "snap")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken"]


def test_out_that_is_not_an_import_is_refused(llama, tmp_path):
    source, _ = llama
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a snapshot written by import-hf"):
        _import(source, tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_pickled_weights_are_refused(tmp_path, llama):
    source, _ = llama
    d = tmp_path / "bin"
    d.mkdir()
    (d / "config.json").write_bytes((source / "config.json").read_bytes())
    (d / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    with pytest.raises(DataError, match="pickled weights"):
        _import(d, tmp_path / "snap")


def test_gguf_tensor_names_are_read_from_the_header_alone(llama, tmp_path):
    """The planner's cheap header read lists the tensors gguf's full reader lists (the tied
    head is detected from it on every Snakemake call)."""
    import gguf

    from pipeline_lib.data.gguf_metadata import read_gguf_header

    _, hf = llama
    path = write_tiny_gguf(hf, tmp_path / "tiny.gguf")
    header = read_gguf_header(path, tensors=True)
    theirs = gguf.GGUFReader(str(path)).tensors
    assert [t.name for t in header.tensors] == [t.name for t in theirs]
    assert [t.dims for t in header.tensors] == [tuple(map(int, t.shape)) for t in theirs]
    assert [header.data_start + t.offset for t in header.tensors] == [
        int(t.data_offset) for t in theirs]
    assert "output.weight" in {t.name for t in header.tensors}
    assert header.fields["llama.block_count"] == 4


def test_repeated_config_files_merge_in_order(llama, tmp_path):
    """``import-hf --config A --config B`` merges A then B over config/config.yaml, as the
    other commands do (it used to keep only B)."""
    import yaml

    from pipeline_lib.cli import main
    from pipeline_lib.spec.config_load import load_config

    source, _ = llama
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"train": {"lr": 0.0005, "warmup_steps": 3},
                                 "model": {"injection_scale": 0.5}}))
    b.write_text(yaml.safe_dump({"train": {"lr": 0.0007}}))
    assert main(["import-hf", "--source", str(source), "--out", str(tmp_path / "snap"),
                 "--config", str(a), "--config", str(b), "experiment.seed=5", "--no-track"]) == 0
    cfg = load_config(tmp_path / "snap" / "config.yaml", base=None)
    assert (cfg.train.lr, cfg.train.warmup_steps, cfg.model.injection_scale) == (0.0007, 3, 0.5)
    assert cfg.experiment.seed == 5
