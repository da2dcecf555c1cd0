"""DCP directories without a process group, optimizer keys by name ↔ index, nested manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipeline_lib.checkpoint.best import update_best_snapshot
from pipeline_lib.checkpoint.contents import dcp_dirs
from pipeline_lib.checkpoint.manifest import (
    MANIFEST_NAME,
    manifest_bytes,
    verify_snapshot,
    write_bytes_file,
)
from pipeline_lib.checkpoint.sharded import (
    dcp_layout,
    flatten_optimizer_state,
    load_dcp,
    optimizer_by_index,
    read_dcp,
    save_dcp,
    unflatten_optimizer_state,
)
from pipeline_lib.errors import CheckpointError


def test_dcp_round_trip_in_one_process(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(5, 3, generator=g), "b": torch.arange(7),
                "step": torch.tensor(4.0), "h": torch.randn(2, generator=g).bfloat16()}
    save_dcp(tensors, tmp_path / "x_dcp")
    files = sorted(p.name for p in (tmp_path / "x_dcp").iterdir())
    assert files and all(f.endswith(".safetensors") for f in files)  # no pickled .metadata
    assert dcp_layout(tmp_path / "x_dcp")["a.weight"] == ((5, 3), torch.float32)
    back = read_dcp(tmp_path / "x_dcp")
    assert back.keys() == tensors.keys()
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in tensors.items())
    into = {"a.weight": torch.zeros(5, 3)}
    load_dcp(into, tmp_path / "x_dcp")  # a subset, in place
    assert torch.equal(into["a.weight"], tensors["a.weight"])


def test_dcp_refuses_missing_keys_shapes_and_non_tensors(tmp_path: Path) -> None:
    save_dcp({"w": torch.ones(4)}, tmp_path / "m_dcp")
    with pytest.raises(CheckpointError, match=r"missing \['v'\]"):
        load_dcp({"v": torch.zeros(4)}, tmp_path / "m_dcp")
    with pytest.raises(CheckpointError, match=r"shape differs \['w'\]"):
        load_dcp({"w": torch.zeros(5)}, tmp_path / "m_dcp")
    with pytest.raises(CheckpointError, match="only tensors go into DCP"):
        save_dcp({"lr": 0.1}, tmp_path / "n_dcp")  # type: ignore[dict-item]
    with pytest.raises(CheckpointError, match="is missing"):
        read_dcp(tmp_path / "absent_dcp")


def test_optimizer_state_by_name_and_back_to_indices() -> None:
    state = {"emb.weight": {"step": torch.tensor(3.0), "exp_avg": torch.ones(2), "tag": "x"},
             "norm.weight": {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}}
    tensors, other = flatten_optimizer_state(state)
    assert sorted(tensors) == ["emb.weight/exp_avg", "emb.weight/step", "norm.weight/exp_avg",
                               "norm.weight/step"]
    assert other == {"emb.weight": {"tag": "x"}}
    assert unflatten_optimizer_state(tensors, other) == state
    doc = {"param_groups": [{"name": "decay", "lr": 0.1, "params": ["norm.weight"]},
                            {"name": "no_decay", "lr": 0.2, "params": ["emb.weight"]}],
           "state_other": other}
    by_index = optimizer_by_index(doc, tensors, "optimizer.json")
    assert [g["params"] for g in by_index["param_groups"]] == [[0], [1]]
    assert by_index["param_groups"][1]["name"] == "no_decay"
    assert list(by_index["state"]) == [0, 1] and by_index["state"][1]["tag"] == "x"
    assert torch.equal(by_index["state"][1]["exp_avg"], torch.ones(2))
    with pytest.raises(CheckpointError, match="does not match its optimizer tensors"):
        optimizer_by_index(doc, {"other.weight/step": torch.tensor(1.0)}, "optimizer.json")


def _nested_snapshot(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "model_dcp").mkdir()
    records = {"model_dcp/shard-1.safetensors":
               write_bytes_file(root / "model_dcp" / "shard-1.safetensors", b"abc", "model_dcp"),
               "config.yaml": write_bytes_file(root / "config.yaml", b"x: 1\n", "config")}
    (root / MANIFEST_NAME).write_bytes(manifest_bytes(records))
    return root


def test_manifest_covers_files_inside_dcp_directories(tmp_path: Path) -> None:
    path = _nested_snapshot(tmp_path / "s")
    manifest = verify_snapshot(path)
    assert "model" in dcp_dirs(manifest)
    (path / "model_dcp" / "shard-1.safetensors").write_bytes(b"abd")
    verify_snapshot(path, hash_files=["config.yaml", "model_dcp/shard-1"])  # not hashed
    for hashed in (None, ["model_dcp/"]):  # everything, or every file in model_dcp/
        with pytest.raises(CheckpointError, match="model_dcp/shard-1.safetensors fails its sha"):
            verify_snapshot(path, hash_files=hashed)
    path = _nested_snapshot(tmp_path / "t")
    (path / "model_dcp" / ".metadata").write_bytes(b"\x80")
    with pytest.raises(CheckpointError, match=r"holds model_dcp/\.metadata"):
        verify_snapshot(path, hash_files=())
    path = _nested_snapshot(tmp_path / "u")
    (path / "optimizer_dcp").mkdir()  # an unlisted (empty) directory
    with pytest.raises(CheckpointError, match="holds optimizer_dcp"):
        verify_snapshot(path, hash_files=())


def test_manifest_names_must_stay_inside_the_snapshot(tmp_path: Path) -> None:
    path = _nested_snapshot(tmp_path / "s")
    doc = json.loads((path / MANIFEST_NAME).read_text())
    doc["files"]["../escape"] = {"size": 1, "sha256": "0" * 64, "role": "config"}
    (path / MANIFEST_NAME).write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="not a relative path inside the snapshot"):
        verify_snapshot(path)


def test_best_copy_of_a_sharded_snapshot_keeps_its_directories(tmp_path: Path) -> None:
    step = _nested_snapshot(tmp_path / "snapshots" / "step_0000004")
    assert update_best_snapshot(tmp_path / "snapshots", step, 1.5)
    best = tmp_path / "snapshots" / "best"
    assert "model" in dcp_dirs(verify_snapshot(best))
    assert (best / "model_dcp" / "shard-1.safetensors").read_bytes() == b"abc"
