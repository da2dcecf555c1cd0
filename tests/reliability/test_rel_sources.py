"""A damaged or odd pretrained source is one line, before any work (issue 29, classes 1–2).

``import-hf`` and the planner read a source through one validated reader
(:mod:`pipeline_lib.pretrained.pretrained_source`): each case damages a tiny Llama saved by
transformers (or the SmolLM2 GGUF) the way a failed download or a hand edit would, runs
the real command and expects exit 2, exactly one ``error:`` line naming the file and the key
or tensor, no traceback, and nothing written. Values that fail validation are named under
the source's file and key, never under loopline's ``model.*`` keys. A Snakemake dry run with
``model.init_from`` at a damaged source fails the same way, at planning time. Configs that
transformers reads differently from loopline, or refuses, are refused in one line too.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support.hf_import_helpers import save_tiny_llama
from support.rel_messages import TINY, assert_one_line_error, entries, run_snakemake, write_yaml

from pipeline_lib.cli import main
from pipeline_lib.data.tokenizer_files import smollm2_gguf_path
from pipeline_lib.errors import DataError
from pipeline_lib.pretrained.pretrained_source import read_source


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A tiny Llama in one safetensors file (``llama``) and in seven shards (``sharded``)."""
    root = tmp_path_factory.mktemp("sources")
    save_tiny_llama(root / "llama")
    save_tiny_llama(root / "sharded", max_shard_size="100KB")
    return root


def _source(pristine: Path, tmp_path: Path, kind: str = "llama", **config: object) -> Path:
    """A copy of a pristine source with ``config.json`` keys set (``None``: removed)."""
    source = tmp_path / "source"
    shutil.copytree(pristine / kind, source)
    data = json.loads((source / "config.json").read_text())
    for key, value in config.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (source / "config.json").write_text(json.dumps(data))
    return source


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(size)


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def _import_fails(tmp_path: Path, capsys, source: Path, *fragments: str, extra=()) -> str:
    """``import-hf`` of ``source`` exits 2 with one ``error:`` line holding ``fragments``
    and writes nothing (no ``--out``, no hidden sibling, the source unchanged)."""
    before = {p: p.stat().st_mtime_ns for p in source.rglob("*")} if source.is_dir() else {}
    code = main(["import-hf", "--source", str(source), "--out", str(tmp_path / "snap"),
                 *extra])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not re.search(r"\bmodel\.\w+ =", lines[0]), lines[0]  # never loopline's keys
    assert entries(tmp_path) == sorted(p.name for p in tmp_path.iterdir()
                                       if p.name in ("source", "source.gguf"))
    assert before == ({p: p.stat().st_mtime_ns for p in source.rglob("*")}
                      if source.is_dir() else {})
    return lines[0]


# --------------------------------------------------------------------------- class 1: damaged


DAMAGE: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...]]] = {
    "truncated safetensors": ("llama", lambda s: _truncate(s / "model.safetensors", 300_000),
                              ("model.safetensors is truncated", "tensor model.layers.")),
    "empty safetensors": ("llama", lambda s: _truncate(s / "model.safetensors", 0),
                          ("model.safetensors is empty",)),
    "header not JSON": ("llama", lambda s: _overwrite(s / "model.safetensors", 8, b"#" * 12),
                        ("model.safetensors: its header is not valid JSON",)),
    "shard the index names is missing": (
        "sharded", lambda s: (s / "model-00003-of-00007.safetensors").unlink(),
        ("model.safetensors.index.json: weight_map puts", "model-00003-of-00007.safetensors",
         "missing")),
    "untied config without a head": (
        "llama", lambda s: _drop_tensor(s / "model.safetensors", "lm_head.weight"),
        ("has no lm_head.weight", "tie_word_embeddings = false")),
    "weights of another shape": (
        "llama", lambda s: _set(s, intermediate_size=128),
        ("model.safetensors: tensor model.layers.0.mlp.gate_proj.weight has shape [96, 64]",
         "config.json implies [128, 64]")),
}


def _drop_tensor(path: Path, name: str) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    del tensors[name]
    save_file(tensors, str(path))


def _put_tensor(path: Path, name: str, size: int) -> None:
    """Replace tensor ``name`` by ones of shape [size]."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(path))
    tensors[name] = np.ones(size, dtype=np.float32)
    save_file(tensors, str(path))


def _set(source: Path, **config: object) -> None:
    data = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**data, **config}))


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_weight_file_is_one_line_naming_it(pristine, tmp_path, capsys, case):
    kind, damage, fragments = DAMAGE[case]
    source = _source(pristine, tmp_path, kind)
    damage(source)
    _import_fails(tmp_path, capsys, source, *fragments)


@pytest.mark.parametrize("config, fragment", [
    ({"num_attention_heads": None}, "config.json: num_attention_heads is missing"),
    ({"num_attention_heads": 0}, "config.json: num_attention_heads = 0 must be an integer"),
    ({"num_key_value_heads": -2}, "config.json: num_key_value_heads = -2 must be an integer"),
    ({"num_key_value_heads": 3}, "config.json: num_attention_heads = 4 is not a multiple of "
                                 "num_key_value_heads = 3"),
    ({"num_hidden_layers": 0}, "config.json: num_hidden_layers = 0 must be an integer"),
    ({"hidden_size": "64"}, "config.json: hidden_size = '64' must be an integer"),
    ({"rms_norm_eps": -1e-5}, "config.json: rms_norm_eps = -1e-05 must be a finite number"),
    ({"tie_word_embeddings": "yes"}, "config.json: tie_word_embeddings = 'yes' must be true"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}},
     "config.json: rope_parameters.rope_theta = 0 must be a finite number"),
    ({"head_dim": "16"}, "config.json: head_dim = '16' must be an integer"),
    ({"head_dim": 15}, "config.json: head_dim = 15 is not an even head width"),
])
def test_a_bad_config_value_is_named_under_the_source_file_and_key(pristine, tmp_path, capsys,
                                                                   config, fragment):
    _import_fails(tmp_path, capsys, _source(pristine, tmp_path, **config), fragment)


def test_a_gguf_truncated_inside_its_tensor_data_is_one_line(tmp_path, capsys):
    gguf = tmp_path / "source.gguf"
    with open(smollm2_gguf_path(), "rb") as src, open(gguf, "wb") as dst:
        dst.write(src.read(60_000_000))  # of 98 MB: the header is whole, the data is not
    _import_fails(tmp_path, capsys, gguf, "source.gguf is truncated: tensor blk.")


@pytest.mark.slow
def test_snakemake_dry_run_refuses_a_damaged_init_source(pristine, tmp_path):
    """The planner reads the source with the same reader: the dry run fails with the line
    (it passed, and the import_init job died with a SafetensorError traceback)."""
    source = _source(pristine, tmp_path)
    _truncate(source / "model.safetensors", 300_000)
    work = tmp_path / "work"
    work.mkdir()
    extra = write_yaml(tmp_path / "init.yaml", {
        "data": {"tokenizer": {"type": "file", "path": str(source)}, "seq_len": 32},
        "model": {"init_from": {"source": str(source)}}})
    result = run_snakemake(work, "--configfile", TINY, extra)
    assert_one_line_error(result, f"{source}/model.safetensors is truncated")
    assert entries(work) in ([], [".snakemake"])


# --------------------------------------------------------------------------- class 2: odd


def test_linear_rope_without_its_factor_is_refused_as_transformers_refuses_it(
        pristine, tmp_path, capsys):
    source = _source(pristine, tmp_path, rope_parameters={"rope_type": "linear",
                                                          "rope_theta": 10000.0})
    _import_fails(tmp_path, capsys, source, "config.json: rope_parameters.factor is missing",
                  "'linear'")


def test_llama3_rope_without_its_frequency_factors_is_refused(pristine, tmp_path, capsys):
    source = _source(pristine, tmp_path, rope_scaling={"type": "llama3", "factor": 8.0},
                     rope_parameters=None)
    _import_fails(tmp_path, capsys, source, "config.json: rope_scaling.low_freq_factor is "
                  "missing")


def test_import_hf_refuses_rows_longer_than_a_mistral_window(pristine, tmp_path, capsys):
    """The default data.seq_len (128) over a 64-token window: refused by import-hf as by the
    planner (it imported, and logits diverged past position 64); within it, imported."""
    source = _source(pristine, tmp_path, architectures=["MistralForCausalLM"],
                     model_type="mistral", sliding_window=64)
    _import_fails(tmp_path, capsys, source, "data.seq_len = 128 exceeds the sliding window",
                  "sliding_window = 64")
    assert main(["import-hf", "--source", str(source), "--out", str(tmp_path / "snap"),
                 "data.seq_len=64"]) == 0


def test_a_mistral_config_without_window_or_kv_heads_has_transformers_defaults(pristine, tmp_path):
    source = _source(pristine, tmp_path, architectures=["MistralForCausalLM"],
                     model_type="mistral", sliding_window=None)
    assert read_source(source).arch.sliding_window == 4096  # MistralConfig's default
    explicit_none = _source(pristine, tmp_path / "b", architectures=["MistralForCausalLM"])
    _set(explicit_none, sliding_window=None)
    assert read_source(explicit_none).arch.sliding_window is None
    # and MistralConfig's 8 key/value heads when the key is absent (4 heads: impossible)
    no_kv = _source(pristine, tmp_path / "c", architectures=["MistralForCausalLM"],
                    num_key_value_heads=None)
    with pytest.raises(DataError, match="num_attention_heads = 4 is not a multiple of "
                                        "num_key_value_heads = 8"):
        read_source(no_kv)


@pytest.mark.parametrize("extra, fragment", [
    ({"tensors": {"rope_freqs.weight": "ones"}}, "source.gguf: tensor rope_freqs.weight"),
    ({"strings": {"llama.rope.scaling.type": "yarn"}},
     "source.gguf: llama.rope.scaling.type = 'yarn' is not supported"),
])
def test_a_gguf_rope_scaling_the_import_would_ignore_is_refused(pristine, tmp_path, capsys,
                                                                extra, fragment):
    """llama.cpp stores Llama 3.1's RoPE scaling as a rope_freqs tensor, and others as
    rope.scaling.type: the import read neither (it imported an unscaled model)."""
    import numpy as np
    from support.hf_import_helpers import write_tiny_gguf
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(pristine / "llama")
    tensors = {k: np.ones(8, dtype=np.float32) for k in extra.get("tensors", {})}
    path = write_tiny_gguf(model, tmp_path / "source.gguf", extra=tensors,
                           strings=extra.get("strings"))
    _import_fails(tmp_path, capsys, path, fragment)


# --------------------------------------------------------------------------- other families


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> Path:
    """A tiny Qwen2, Qwen3 and OLMo-2, each in one safetensors file."""
    root = tmp_path_factory.mktemp("families")
    for family in ("qwen2", "qwen3", "olmo2"):
        save_tiny_llama(root / family, family=family)
    return root


@pytest.mark.parametrize("kind, damage, fragments", [
    ("qwen2", lambda s: _drop_tensor(s / "model.safetensors",
                                     "model.layers.2.self_attn.k_proj.bias"),
     ("lacks tensor model.layers.2.self_attn.k_proj.bias", "Qwen2ForCausalLM")),
    ("olmo2", lambda s: _drop_tensor(s / "model.safetensors",
                                     "model.layers.1.post_feedforward_layernorm.weight"),
     ("lacks tensor model.layers.1.post_feedforward_layernorm.weight",)),
    ("olmo2", lambda s: _put_tensor(s / "model.safetensors",
                                    "model.layers.3.self_attn.k_norm.weight", 16),
     ("tensor model.layers.3.self_attn.k_norm.weight has shape [16]",
      "config.json implies [32]")),  # OLMo-2's gain spans all 2 key/value heads
    ("qwen3", lambda s: _set(s, head_dim=8),
     ("tensor model.layers.0.self_attn.q_proj.weight has shape [64, 64]",
      "config.json implies [32, 64]")),
])
def test_a_family_s_own_tensors_are_checked_like_llama_s(families, tmp_path, capsys, kind,
                                                         damage, fragments):
    """Biases, QK-norm gains and post-norms are in the shape check before any work (they
    were read unchecked, and a missing or misshapen one failed inside torch)."""
    source = _source(families, tmp_path, kind)
    damage(source)
    _import_fails(tmp_path, capsys, source, *fragments)


ABSENT = ("num_key_value_heads", "head_dim", "rms_norm_eps", "sliding_window",
          "use_sliding_window")


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3", "olmo2"])
@pytest.mark.parametrize("use_window", [None, True])
def test_keys_a_config_lacks_mean_what_transformers_makes_of_them(tmp_path, kind, use_window):
    """Each family's config class fills a missing key its own way (Qwen2/Qwen3: 32 key/value
    heads; Qwen3: head_dim 128; OLMo-2: rms_norm_eps 1e-5; Mistral: a 4096-token window;
    Qwen: a window only with use_sliding_window): the reader reads what transformers does."""
    from transformers import AutoConfig

    from pipeline_lib.pretrained.source_config import hf_arch

    save_tiny_llama(tmp_path, family=kind)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ABSENT:
        config.pop(key, None)
    # 64 heads: a multiple of Qwen's 32 key/value heads, and not 32 (the test would not see
    # Qwen's default); the weights are not read
    config.update(hidden_size=256, num_attention_heads=64)
    if use_window:
        config["use_sliding_window"] = True
    (tmp_path / "config.json").write_text(json.dumps(config))
    theirs, ours = AutoConfig.from_pretrained(tmp_path), hf_arch(tmp_path)
    # the attention modules' own reading of head_dim (OLMo-2's config class has none)
    head_dim = getattr(theirs, "head_dim", None) or 256 // 64
    assert (ours.kv_heads, ours.head_dim, ours.rms_norm_eps, ours.sliding_window) == (
        theirs.num_key_value_heads, head_dim, theirs.rms_norm_eps,
        getattr(theirs, "sliding_window", None))


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_a_bias_flag_the_family_ignores_is_ignored(families, pristine, tmp_path, kind):
    """transformers' Mistral and Qwen2 never read attention_bias or mlp_bias (Qwen2's q/k/v
    biases are always there, its output projection never has one): such a source is read
    as transformers loads it."""
    from transformers import AutoModelForCausalLM

    root = families if kind == "qwen2" else pristine
    source = _source(root, tmp_path, "qwen2" if kind == "qwen2" else "llama",
                     attention_bias=True, mlp_bias=True,
                     **({} if kind == "qwen2" else {"architectures": ["MistralForCausalLM"],
                                                    "model_type": "mistral"}))
    layer = AutoModelForCausalLM.from_pretrained(source).model.layers[0]
    assert layer.self_attn.o_proj.bias is None and layer.mlp.up_proj.bias is None
    assert read_source(source).arch.architecture.lower().startswith(kind)
