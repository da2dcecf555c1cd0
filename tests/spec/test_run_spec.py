"""Spec files: named by their digest, written once and atomically, read back equal and
verified (an edited, truncated or incomplete file is refused in one line, never completed
with defaults), credentials never on disk."""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import pytest
import yaml

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.config_write import to_dict
from pipeline_lib.spec.run_spec import (
    RunSpec,
    SpecRef,
    read_run_spec,
    spec_digest,
    spec_path,
    write_run_spec,
)

SECRET_URI = "http://alice:s3cret@mlflow.example:5000"


def _spec(*overrides: str) -> RunSpec:
    cfg = load_config(None, ["train.total_steps=40", "model.loops=2", *overrides])
    return RunSpec(name="loops2", config=cfg, data_id="0123456789ab", vocab_size=258,
                   init={"fingerprint": "0123456789ab", "architecture": "LlamaForCausalLM",
                         "layers": {"prelude": [0, 2], "core": [2, 4], "coda": [4, 6]}})


def test_a_spec_is_stored_under_its_digest_and_reads_back_equal(tmp_path: Path) -> None:
    spec = _spec("train.lr=0.002")
    assert write_run_spec(spec, tmp_path) is True
    path = spec_path(tmp_path, spec.digest)
    assert path == tmp_path / "specs" / f"{spec.digest}.yaml"
    assert spec.digest == spec_digest(path.read_text()) and len(spec.digest) == 16
    back = read_run_spec(tmp_path, spec.digest)
    assert back == spec
    assert to_dict(back.config) == to_dict(spec.config)


def test_a_changed_config_is_another_file_and_no_file_is_rewritten(tmp_path: Path) -> None:
    """What a second Snakemake call with another config writes never changes the spec the
    first call's jobs read."""
    first, changed = _spec(), _spec("train.lr=0.005")
    write_run_spec(first, tmp_path)
    path = spec_path(tmp_path, first.digest)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert write_run_spec(first, tmp_path) is False
    assert path.stat().st_mtime_ns == 1_000_000_000  # unchanged: not written again
    assert write_run_spec(changed, tmp_path) is True
    assert changed.digest != first.digest
    assert read_run_spec(tmp_path, first.digest).config.train.lr == first.config.train.lr
    assert read_run_spec(tmp_path, changed.digest).config.train.lr == 0.005
    assert sorted(p.name for p in (tmp_path / "specs").iterdir()) == sorted(
        f"{s.digest}.yaml" for s in (first, changed))  # no temporary left


def test_a_damaged_file_is_written_again_under_its_name(tmp_path: Path) -> None:
    spec = _spec()
    write_run_spec(spec, tmp_path)
    path = spec_path(tmp_path, spec.digest)
    path.write_text(path.read_text()[:200])
    assert write_run_spec(spec, tmp_path) is True
    assert read_run_spec(tmp_path, spec.digest) == spec


def test_credentials_stay_off_disk_and_come_back_only_for_the_same_store(tmp_path: Path) -> None:
    spec = _spec(f"tracking.uri={SECRET_URI}")
    write_run_spec(spec, tmp_path)
    assert "s3cret" not in spec_path(tmp_path, spec.digest).read_text()
    back = read_run_spec(tmp_path, spec.digest)
    assert back.config.tracking.uri == "http://mlflow.example:5000"
    assert back.with_tracking_uri(SECRET_URI).config.tracking.uri == SECRET_URI
    other = "http://bob:x@elsewhere:5000"
    assert back.with_tracking_uri(other) == back  # another store: not taken
    assert spec.digest == back.digest  # the digest is of the file: no credentials in it


def _doc(spec: RunSpec) -> dict:
    return yaml.safe_load(spec.to_yaml())


def _store(tmp_path: Path, doc: dict) -> str:
    """``doc`` written as a spec file under its own digest (as if written by other code)."""
    text = yaml.safe_dump(doc, sort_keys=False)
    digest = spec_digest(text)
    spec_path(tmp_path, digest).parent.mkdir(parents=True, exist_ok=True)
    spec_path(tmp_path, digest).write_text(text)
    return digest


def _without(doc: dict, *keys: str) -> dict:
    section = doc
    for key in keys[:-1]:
        section = section[key]
    del section[keys[-1]]
    return doc


@pytest.mark.parametrize("damage, says", [
    ("missing", "does not exist: the Snakemake call that planned this job writes"),
    ("truncated", "was changed after it was written"),
    ("edited", "was changed after it was written"),
    ("format 2", "is not a run spec of format 3"),
    ("no init", "lacks key init"),
    ("no train.lr", "lacks key config.train.lr: a spec is complete as written, never "
                    "completed with defaults"),
    ("no data_id", "lacks key data_id"),
    ("extra key", "has unknown key extra"),
    ("unknown config key", "is not a spec this code reads"),
])
def test_a_missing_edited_or_incomplete_spec_is_one_line(tmp_path: Path, damage: str,
                                                         says: str) -> None:
    spec = _spec()
    digest = spec.digest
    write_run_spec(spec, tmp_path)
    path = spec_path(tmp_path, digest)
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_text(path.read_text()[: len(path.read_text()) // 2])
    elif damage == "edited":
        path.write_text(path.read_text().replace("lr: 0.002", "lr: 0.02"))
    else:
        doc = _doc(spec)
        doc = {"format 2": lambda d: {**d, "format": 2},
               "no init": lambda d: _without(d, "init"),
               "no train.lr": lambda d: _without(d, "config", "train", "lr"),
               "no data_id": lambda d: _without(d, "data_id"),
               "extra key": lambda d: {**d, "extra": 1},
               "unknown config key": lambda d: {**d, "config": {**d["config"], "nope": 1}},
               }[damage](doc)
        digest = _store(tmp_path, doc)
        path = spec_path(tmp_path, digest)
    with pytest.raises(ConfigError, match=says) as err:
        read_run_spec(tmp_path, digest)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and "run snakemake again" in message


def test_a_spec_ref_survives_pickling_and_prints_its_digest() -> None:
    """What a rule passes as params.spec: pickled into the job's script by Snakemake."""
    ref = SpecRef("loops2", "0123456789abcdef")
    assert pickle.loads(pickle.dumps(ref)) == ref and str(ref) == "0123456789abcdef"


def test_a_spec_of_a_changed_config_reads_back_whole(tmp_path: Path) -> None:
    spec = _spec()
    changed = dataclasses.replace(spec, data_id="ba9876543210", vocab_size=300)
    for s in (spec, changed):
        write_run_spec(s, tmp_path)
    assert read_run_spec(tmp_path, changed.digest) == changed
    assert read_run_spec(tmp_path, spec.digest) == spec
