"""The flat adaptive-exit keys of eval and bench from before ``eval.adaptive``/
``bench.adaptive`` are read as the new keys, with a warning: in a user's file, an override,
a ``runs:`` variant, a plain mapping (the Snakefile's plan) and a snapshot's config.yaml."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml

from pipeline_lib.checkpoint.compat import config_from_yaml
from pipeline_lib.spec.config_load import config_for_run, config_from_dict, load_config
from pipeline_lib.spec.config_write import config_yaml, to_dict

OLD_EVAL = {"adaptive_thresholds": [0.0, 0.5], "adaptive_criterion": "entropy",
            "adaptive_criteria": [], "adaptive_criterion_thresholds": {"cosine": [0.0, 0.2]},
            "adaptive_max_loops": 6}
OLD_BENCH = {"adaptive_thresholds": [0.01], "adaptive_criterion": "latent_diff",
             "adaptive_max_loops": 3}


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_file_with_the_old_keys_loads_as_the_new_ones(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config(_write(tmp_path, {"eval": OLD_EVAL, "bench": OLD_BENCH}))
    a = cfg.eval.adaptive
    assert (a.criteria, a.thresholds, a.max_loops) == (["entropy"], [0.0, 0.5], 6)
    assert a.criterion_thresholds["cosine"] == [0.0, 0.2]
    assert a.criterion_thresholds["gate"] == [1.0, 0.99, 0.9, 0.5]  # the defaults stay
    b = cfg.bench.adaptive
    assert (b.criteria, b.thresholds, b.max_loops) == (["latent_diff"], [0.01], 3)
    (line,) = [r.getMessage() for r in caplog.records if "adaptive" in r.getMessage()]
    assert "old.yaml: eval.adaptive_thresholds → eval.adaptive.thresholds" in line
    assert "bench.adaptive_criterion → bench.adaptive.criteria (a list)" in line
    assert "rename them there" in line


def test_the_old_list_wins_over_the_old_single_criterion(tmp_path):
    old = {"adaptive_criterion": "entropy", "adaptive_criteria": ["kl", "cosine"]}
    assert load_config(_write(tmp_path, {"eval": old})).eval.adaptive.criteria == [
        "kl", "cosine"]
    default = load_config(_write(tmp_path, {"eval": {"adaptive_criteria": []}}))
    assert default.eval.adaptive.criteria == ["kl"]  # empty meant [adaptive_criterion: kl]


def test_overrides_variants_and_plain_mappings(tmp_path):
    cfg = load_config(None, ["eval.adaptive_thresholds=[0.25]", "bench.adaptive_max_loops=5"])
    assert cfg.eval.adaptive.thresholds == [0.25] and cfg.bench.adaptive.max_loops == 5
    runs = {"runs": {"a": {"eval": {"adaptive_criterion": "cosine"}}}}
    variant = config_for_run(load_config(_write(tmp_path, runs)), "a")
    assert variant.eval.adaptive.criteria == ["cosine"]
    plain = config_from_dict({**to_dict(load_config(None)), "bench": OLD_BENCH})
    assert plain.bench.adaptive.criteria == ["latent_diff"]


def test_a_snapshot_config_written_before_the_subsection_loads_unchanged():
    cfg = load_config(None)
    old = yaml.safe_load(config_yaml(cfg))
    for section in ("eval", "bench"):  # written as the previous version wrote it
        adaptive = old[section].pop("adaptive")
        old[section].update({"adaptive_thresholds": adaptive["thresholds"],
                             "adaptive_criterion": adaptive["criteria"][0],
                             "adaptive_max_loops": adaptive["max_loops"]})
        if section == "eval":
            old[section].update({"adaptive_criteria": [],
                                 "adaptive_criterion_thresholds":
                                     adaptive["criterion_thresholds"]})
    assert config_from_yaml(yaml.safe_dump(old), "old/config.yaml") == cfg


def test_new_keys_alone_warn_nothing(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        load_config(_write(tmp_path, {"eval": {"adaptive": {"criteria": ["kl", "entropy"]}}}))
    assert not [r for r in caplog.records if "adaptive" in r.getMessage()]


@pytest.mark.parametrize("key", ["eval.adaptive_criterion=margin", "bench.adaptive_criterion=x"])
def test_a_bad_old_value_is_named_by_its_new_key(key):
    from pipeline_lib.errors import ConfigError

    section = key.split(".")[0]
    with pytest.raises(ConfigError, match=rf"{section}\.adaptive\.criteria\[0\] = '\w+' is not "
                                          "allowed"):
        load_config(None, [key])
