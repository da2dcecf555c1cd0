"""safetensors writer/reader and the tagged-JSON tree codec."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline_lib.checkpoint.tensorio import (
    ALIASES_KEY,
    join_tree,
    read_safetensors,
    split_tree,
    write_safetensors,
)
from pipeline_lib.errors import CheckpointError

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
          torch.int16, torch.int8, torch.uint8, torch.bool]


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = {f"t_{str(dt).split('.')[-1]}": (torch.randn(3, 5, generator=g) * 50).to(dt)
           for dt in DTYPES}
    out["scalar"] = torch.tensor(2.5)
    out["empty"] = torch.zeros(0, 4)
    out["transposed"] = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous view
    return out


def test_written_file_is_standard_safetensors_and_record_matches(tmp_path):
    tensors = _tensors()
    path = tmp_path / "x.safetensors"
    record = write_safetensors(path, tensors, role="model", metadata={"k": "v"})
    data = path.read_bytes()
    assert record == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                      "role": "model"}
    header_len = int.from_bytes(data[:8], "little")
    assert header_len % 8 == 0
    loaded = load_file(str(path))  # the reference reader
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype
        assert torch.equal(loaded[name], t), name


def test_read_back_bit_exact_with_metadata(tmp_path):
    tensors = _tensors()
    write_safetensors(tmp_path / "x.safetensors", tensors, role="r", metadata={"k": "v"})
    out, meta = read_safetensors(tmp_path / "x.safetensors")
    assert meta == {"k": "v"}
    assert list(out) == list(tensors)  # the caller's order, not safetensors' sorted one
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert out[name].view(-1).view(torch.uint8).tolist() == \
            t.contiguous().view(-1).view(torch.uint8).tolist()


def test_tied_tensors_stored_once_and_restored_tied(tmp_path):
    emb = torch.randn(64, 8)
    path = tmp_path / "tied.safetensors"
    write_safetensors(path, {"embed.weight": emb, "head.weight": emb, "row": emb[3]}, role="m")
    raw = load_file(str(path))
    assert set(raw) == {"embed.weight", "row"}  # alias not duplicated on disk
    out, meta = read_safetensors(path)
    assert ALIASES_KEY not in meta
    assert out["head.weight"] is out["embed.weight"]
    assert torch.equal(out["row"], emb[3])  # overlapping view stored as its own copy
    assert path.stat().st_size < 64 * 8 * 4 * 2


def test_unstorable_values_raise_naming_the_key(tmp_path):
    with pytest.raises(CheckpointError, match="'bad'"):
        write_safetensors(tmp_path / "x.safetensors", {"bad": torch.zeros(2, dtype=torch.complex64)},
                          role="m")
    with pytest.raises(CheckpointError, match="'n'"):
        write_safetensors(tmp_path / "x.safetensors", {"n": 3}, role="m")  # type: ignore[dict-item]


def test_corrupt_file_raises_checkpoint_error(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(CheckpointError, match="x.safetensors"):
        read_safetensors(path)


def test_tree_round_trip_keeps_int_keys_tuples_and_tensors():
    t1, t2 = torch.randn(3), torch.tensor(7.0)
    tree = {
        "state": {0: {"step": t2, "exp_avg": t1}, 5: {}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0, 5], "foreach": None,
                          "name": "decay", "nan": float("nan")}],
        "__tensor__": "not a tag here",
        (1, 2): "tuple key",
    }
    doc, tensors = split_tree(tree, "opt")
    text = json.dumps(doc)  # plain JSON
    back = join_tree(json.loads(text), tensors, "opt")
    assert set(back) == set(tree)
    assert list(back["state"]) == [0, 5]
    assert back["state"][0]["exp_avg"] is t1 and back["state"][0]["step"] is t2
    group = back["param_groups"][0]
    assert group["betas"] == (0.9, 0.95) and isinstance(group["betas"], tuple)
    assert group["lr"] == 1e-3 and group["params"] == [0, 5] and group["foreach"] is None
    assert group["nan"] != group["nan"]
    assert back["__tensor__"] == "not a tag here" and back[(1, 2)] == "tuple key"
    assert sorted(tensors) == ["state/0/exp_avg", "state/0/step"]


def test_tree_rejects_unknown_types_naming_the_path():
    with pytest.raises(CheckpointError, match="/a/b"):
        split_tree({"a": {"b": object()}}, "x")
    with pytest.raises(CheckpointError, match="missing"):
        join_tree({"__tensor__": "gone"}, {}, "x")
