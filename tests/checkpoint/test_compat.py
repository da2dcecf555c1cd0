"""Resume compatibility listing; a snapshot's config read back."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from pipeline_lib.checkpoint.compat import (
    check_resume_compatible,
    config_from_yaml,
    resume_mismatches,
)
from pipeline_lib.errors import CheckpointError
from pipeline_lib.spec.config import Config, SourceConfig
from pipeline_lib.spec.config_write import to_dict


def _replace(cfg: Config, section: str, **changes) -> Config:
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section),
                                                                   **changes)})


def test_identical_configs_are_compatible():
    check_resume_compatible(Config(), Config())


def test_allowed_changes_pass():
    cfg = Config()
    new = _replace(cfg, "train", total_steps=900, steps_per_segment=7, lr=1e-4, schedule="wsd",
                   warmup_steps=3, nproc=2, micro_batch_rows=4, grad_clip=0.5, weight_decay=0.0)
    new = _replace(new, "model", attention="sdpa", loss_chunk_size=64)
    new = _replace(new, "eval", h_eff=[1, 2])
    assert resume_mismatches(cfg, new) == []


def test_mismatches_are_all_listed():
    cfg = Config()
    new = _replace(cfg, "model", d_model=256, moe_experts=4)
    new = _replace(new, "train", optimizer="adamatan2", global_batch_rows=32, beta2=0.99)
    new = _replace(new, "data", seq_len=64,
                   sources=[*cfg.data.sources, SourceConfig(type="text", path="x/*.txt")])
    diffs = resume_mismatches(cfg, new)
    keys = [k for k, _, _ in diffs]
    assert keys == sorted(keys)
    assert set(keys) >= {"model.d_model", "model.moe_experts", "train.optimizer",
                         "train.global_batch_rows", "train.beta2", "data.seq_len",
                         "data.sources (length)", "data.sources[2].type"}
    assert ("model.d_model", 128, 256) in diffs
    with pytest.raises(CheckpointError) as err:
        check_resume_compatible(cfg, new, source="runs/x/step_0000100")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("cannot resume from runs/x/step_0000100")
    for key in ("model.d_model: snapshot 128, now 256", "train.optimizer: snapshot 'adamw', "
                "now 'adamatan2'", "data.seq_len", "train.global_batch_rows", "warm-start"):
        assert key in msg


def test_vocab_size_zero_means_from_tokenizer():
    cfg = Config()
    assert resume_mismatches(_replace(cfg, "model", vocab_size=260), cfg) == []
    diffs = resume_mismatches(_replace(cfg, "model", vocab_size=260),
                              _replace(cfg, "model", vocab_size=300))
    assert diffs == [("model.vocab_size", 260, 300)]


def test_freeze_list_is_compared_as_a_set_and_muon_momentum_only_under_muon():
    cfg = _replace(Config(), "train", freeze=["core", "embeddings"])
    assert resume_mismatches(cfg, _replace(cfg, "train", freeze=["embeddings", "core"])) == []
    assert resume_mismatches(cfg, _replace(cfg, "train", freeze=["core"])) == [
        ("train.freeze", ["core", "embeddings"], ["core"])]
    assert resume_mismatches(cfg, _replace(cfg, "train", muon_momentum=0.9)) == []  # adamw
    muon = _replace(cfg, "train", optimizer="muon")
    assert resume_mismatches(muon, _replace(muon, "train", muon_momentum=0.9, muon_lr=0.02,
                                            muon_adjust_lr="original")) == [
        ("train.muon_momentum", 0.95, 0.9)]
    with pytest.raises(CheckpointError, match=r"train\.freeze: snapshot \['core', "
                       r"'embeddings'\], now \[\]\); restore these values, or warm-start"):
        check_resume_compatible(cfg, Config())


def test_config_from_yaml_round_trip_and_errors():
    cfg = _replace(Config(), "train", lr=1e-4)
    text = OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg)))
    assert config_from_yaml(text, "snap/config.yaml") == cfg
    with pytest.raises(CheckpointError, match="snap/config.yaml is not a config"):
        config_from_yaml("model:\n  wings: 2\n", "snap/config.yaml")
    with pytest.raises(CheckpointError, match="not valid YAML"):
        config_from_yaml("a: [1,\n", "snap/config.yaml")


NEW_MODEL_KEYS = ("n_kv_heads", "rope_scaling", "rope_scaling_factor", "rope_low_freq_factor",
                  "rope_high_freq_factor", "rope_original_max_position")


def test_a_snapshot_from_before_gqa_and_rope_scaling_resumes_under_their_defaults(tmp_path):
    """config.yaml files written before model.n_kv_heads and the rope_* keys existed load
    with the defaults (plain multi-head attention, unscaled RoPE) and resume under the same
    config; a grouped-query run does not resume from them."""
    from pipeline_lib.checkpoint.compat import snapshot_config

    data = to_dict(Config())
    for key in NEW_MODEL_KEYS:
        del data["model"][key]
    text = OmegaConf.to_yaml(OmegaConf.create(data))
    (tmp_path / "config.yaml").write_text(text)
    for old in (config_from_yaml(text, "snap/config.yaml"), snapshot_config(tmp_path)):
        assert old == Config()
        assert (old.model.n_kv_heads, old.model.rope_scaling) == (0, "none")
        assert resume_mismatches(old, Config()) == []
        assert resume_mismatches(old, _replace(Config(), "model", n_kv_heads=2)) == [
            ("model.n_kv_heads", 0, 2)]
