"""Where a snapshot's tokenizer is found, and what loading refuses."""

from __future__ import annotations

import pytest
from snapshot_helpers import write_tiny_snapshot

from pipeline_lib.config import load_config
from pipeline_lib.data.identity import data_id
from pipeline_lib.errors import CheckpointError, DataError
from pipeline_lib.evaluate.loading import load_for_eval as load_for_bench


def test_tokenizer_from_snapshot_data_pack_or_override(trained_model, tokenizer, tmp_path,
                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # results_dir "results" relative to here does not exist yet
    snap = write_tiny_snapshot(tmp_path / "elsewhere/results/base/snapshots/step_0000005",
                               trained_model, tokenizer, step=5, with_tokenizer=False)
    with pytest.raises(DataError, match="tokenizer=PATH"):
        load_for_bench(snap)
    loaded = load_for_bench(snap, with_tokenizer=False)  # loss-only evaluation needs none
    assert loaded.tokenizer is None and loaded.step == 5 and loaded.seq_len == 24
    ident = data_id(load_config(snap / "config.yaml", base=None).data)
    pack = tmp_path / "elsewhere/results/data" / ident  # the run tree's data pack
    pack.mkdir(parents=True)
    tokenizer.save(str(pack / "tokenizer.json"))
    assert load_for_bench(snap).tokenizer.to_str() == tokenizer.to_str()
    (pack / "tokenizer.json").unlink()
    other = tmp_path / "tok.json"
    tokenizer.save(str(other))
    assert load_for_bench(snap, tokenizer=str(other)).tokenizer.encode("ab").ids == [97, 98]


def test_damaged_snapshot_is_refused(trained_model, tokenizer, tmp_path):
    snap = write_tiny_snapshot(tmp_path / "step_0000001", trained_model, tokenizer, step=1)
    (snap / "config.yaml").write_text((snap / "config.yaml").read_text().replace("loops: 2",
                                                                                 "loops: 3"))
    with pytest.raises(CheckpointError, match="config.yaml"):
        load_for_bench(snap)
