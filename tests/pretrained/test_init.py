"""model.init_from resolved from a source's headers: the model section the source fixes, the
user's loops kept; a tokenizer or a row length the source cannot serve is one ConfigError."""

from __future__ import annotations

import dataclasses
import json

import pytest
from support.hf_import_helpers import save_tiny_llama
from tokenizers import Tokenizer, models

from pipeline_lib.errors import ConfigError
from pipeline_lib.pretrained.init import resolve_init_from
from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.spec.init_source import fingerprint_id


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(directory, transformers model): GQA 4/2 heads, untied head, 4 layers."""
    root = tmp_path_factory.mktemp("tiny_llama")
    return root, save_tiny_llama(root)


def _init_config(source, tokenizer, **init):
    return config_from_dict({"data": {"tokenizer": tokenizer},
                             "model": {"loops": 3, "init_from": {"source": str(source), **init}}})


def test_init_from_derives_the_model_section_and_keeps_the_users_loops(llama):
    source, _ = llama
    cfg, init = resolve_init_from(_init_config(source, {"type": "file", "path": str(source)},
                                               prelude=[0, 1], core=[1, 3], coda=[3, 4],
                                               adapter="linear"))
    m = cfg.model
    assert (m.d_model, m.n_heads, m.n_kv_heads, m.ffn_hidden, m.vocab_size) == (64, 4, 2, 96, 264)
    assert (m.prelude_layers, m.core_layers, m.coda_layers, m.loops) == (1, 2, 1, 3)
    assert (m.injection, m.tie_embeddings, m.norm_eps) == ("linear", False, 1e-5)
    assert init == {"fingerprint": fingerprint_id(source), "architecture": "LlamaForCausalLM",
                    "layers": {"prelude": [0, 1], "core": [1, 3], "coda": [3, 4]}}


@pytest.mark.parametrize("tokenizer, match", [
    ({"type": "byte"}, "brings its own tokenizer"),
    ({"type": "file", "path": "BIG"}, "embedding rows"),
])
def test_init_from_refuses_a_tokenizer_that_does_not_fit(llama, tmp_path, tokenizer, match):
    source, _ = llama
    if tokenizer.get("path") == "BIG":  # 300 ids for an embedding of 264 rows
        big = Tokenizer(models.WordLevel({f"w{i}": i for i in range(299)} | {"</s>": 299},
                                         unk_token="w0"))
        big.add_special_tokens(["</s>"])
        big.save(str(tmp_path / "tokenizer.json"))
        tokenizer = {"type": "file", "path": str(tmp_path / "tokenizer.json")}
    with pytest.raises(ConfigError, match=match):
        resolve_init_from(_init_config(source, tokenizer))


def test_init_from_refuses_rows_longer_than_a_mistral_window(llama, tmp_path):
    source, _ = llama
    mistral = tmp_path / "mistral"
    mistral.mkdir()
    config = json.loads((source / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], sliding_window=64)
    (mistral / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "model.safetensors"):
        (mistral / name).write_bytes((source / name).read_bytes())
    cfg = _init_config(mistral, {"type": "file", "path": str(mistral)})
    with pytest.raises(ConfigError, match="sliding window"):
        resolve_init_from(dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seq_len=128)))
