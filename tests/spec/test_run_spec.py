"""run_spec.yaml: written once and atomically, read back equal, credentials never on disk."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import load_config, to_dict
from pipeline_lib.spec.run_spec import RunSpec, read_run_spec, run_spec_path, write_run_spec

SECRET_URI = "http://alice:s3cret@mlflow.example:5000"


def _spec(*overrides: str) -> RunSpec:
    cfg = load_config(None, ["train.total_steps=40", "model.loops=2", *overrides])
    return RunSpec(name="loops2", config=cfg, data_id="0123456789ab", vocab_size=258)


def test_a_spec_reads_back_equal(tmp_path: Path) -> None:
    spec = _spec("train.lr=0.002")
    assert write_run_spec(spec, tmp_path) is True
    back = read_run_spec(tmp_path)
    assert back == spec
    assert to_dict(back.config) == to_dict(spec.config)


def test_an_unchanged_spec_is_not_rewritten(tmp_path: Path) -> None:
    write_run_spec(_spec(), tmp_path)
    path = run_spec_path(tmp_path)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert write_run_spec(_spec(), tmp_path) is False
    assert path.stat().st_mtime_ns == 1_000_000_000  # Snakemake sees nothing new
    assert write_run_spec(_spec("train.lr=0.005"), tmp_path) is True
    assert read_run_spec(tmp_path).config.train.lr == 0.005
    assert [p.name for p in tmp_path.iterdir()] == ["run_spec.yaml"]  # no temporary left


def test_credentials_stay_off_disk_and_come_back_only_for_the_same_store(tmp_path: Path) -> None:
    spec = _spec(f"tracking.uri={SECRET_URI}")
    write_run_spec(spec, tmp_path)
    assert "s3cret" not in run_spec_path(tmp_path).read_text()
    back = read_run_spec(tmp_path)
    assert back.config.tracking.uri == "http://mlflow.example:5000"
    assert back.with_tracking_uri(SECRET_URI).config.tracking.uri == SECRET_URI
    other = "http://bob:x@elsewhere:5000"
    assert back.with_tracking_uri(other) == back  # another store: not taken


@pytest.mark.parametrize("text, says", [
    (None, "does not exist: Snakemake writes it"),
    ("format: 7\n", "not a run spec of format 1"),
    ("[unclosed\n", "cannot be read"),
    ("format: 1\nrun: x\n", "lacks or mangles"),
])
def test_a_missing_or_foreign_spec_is_one_line(tmp_path: Path, text: str | None,
                                               says: str) -> None:
    if text is not None:
        run_spec_path(tmp_path).write_text(text)
    with pytest.raises(ConfigError, match=says) as err:
        read_run_spec(tmp_path)
    assert "\n" not in str(err.value) and "run_spec.yaml" in str(err.value)


def test_a_spec_of_a_changed_config_is_rewritten_whole(tmp_path: Path) -> None:
    spec = _spec()
    write_run_spec(spec, tmp_path)
    changed = dataclasses.replace(spec, data_id="ba9876543210", vocab_size=300)
    write_run_spec(changed, tmp_path)
    assert read_run_spec(tmp_path) == changed
