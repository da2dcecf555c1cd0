"""A snapshot's own tokenizer (no search), and what loading refuses."""

from __future__ import annotations

import pytest
from snapshot_helpers import write_tiny_snapshot

from pipeline_lib.errors import CheckpointError
from pipeline_lib.evaluate.loading import load_for_eval as load_for_bench
from pipeline_lib.spec.config_load import load_config
from pipeline_lib.spec.data_id import data_id


def test_tokenizer_from_the_snapshot_or_override(trained_model, tokenizer, tmp_path,
                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    snap = write_tiny_snapshot(tmp_path / "results/base/snapshots/step_0000005",
                               trained_model, tokenizer, step=5)
    assert load_for_bench(snap).tokenizer.to_str() == tokenizer.to_str()  # its own copy
    old = write_tiny_snapshot(tmp_path / "results/old/snapshots/step_0000005",
                              trained_model, tokenizer, step=5, with_tokenizer=False)
    ident = data_id(load_config(old / "config.yaml", base=None).data)
    pack = tmp_path / "results/data" / ident  # a data pack next to it is not searched
    pack.mkdir(parents=True)
    tokenizer.save(str(pack / "tokenizer.json"))
    with pytest.raises(CheckpointError, match=f"no tokenizer.json .*tokenizer=results/data/{ident}"):
        load_for_bench(old)
    loaded = load_for_bench(old, with_tokenizer=False)  # loss-only evaluation needs none
    assert loaded.tokenizer is None and loaded.step == 5 and loaded.seq_len == 24
    other = tmp_path / "tok.json"
    tokenizer.save(str(other))
    assert load_for_bench(old, tokenizer=str(other)).tokenizer.encode("ab").ids == [97, 98]


def test_damaged_snapshot_is_refused(trained_model, tokenizer, tmp_path):
    snap = write_tiny_snapshot(tmp_path / "step_0000001", trained_model, tokenizer, step=1)
    (snap / "config.yaml").write_text((snap / "config.yaml").read_text().replace("loops: 2",
                                                                                 "loops: 3"))
    with pytest.raises(CheckpointError, match="config.yaml"):
        load_for_bench(snap)


def test_flipped_byte_in_the_tokenizer_is_refused(trained_model, tokenizer, tmp_path):
    snap = write_tiny_snapshot(tmp_path / "step_0000001", trained_model, tokenizer, step=1)
    blob = bytearray((snap / "tokenizer.json").read_bytes())
    blob[10] ^= 0x01
    (snap / "tokenizer.json").write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="tokenizer.json fails its sha256"):
        load_for_bench(snap)
    assert load_for_bench(snap, with_tokenizer=False).step == 1  # loss-only reads none of it
