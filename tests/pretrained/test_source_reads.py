"""A run reads its pretrained source's headers once, in the plan (``resolve_run``, which
records what the source resolved to in the RunSpec), and the import job its tensors once:
one open of each weights file for all its tensors and of config.json for the model and its
tokenizer alike, no header checked again (it used to check the headers twice, open a file
again for every tensor and read config.json twice); a source changed since the plan is
refused."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import safetensors
from support.hf_import_helpers import save_tiny_llama

from pipeline_lib.errors import DataError
from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.spec.init_source import fingerprint_id
from pipeline_lib.workflow.resolve import resolve_run
from pipeline_lib.workflow.stages.interop import import_stage

_WATCHED: list[tuple[Path, Counter]] = []  # (source directory, opens by file name)


def _count_open(event: str, args: tuple) -> None:
    """Audit hook: every open (Python's and os.open) of a file in a watched directory."""
    if event == "open" and _WATCHED and isinstance(args[0], str | bytes | os.PathLike):
        path = Path(os.fsdecode(args[0]))
        for root, opens in _WATCHED:
            if path.parent == root:
                opens[path.name] += 1


sys.addaudithook(_count_open)  # hooks cannot be removed: this one counts only while watched


@pytest.fixture
def reads(tmp_path, monkeypatch):
    """(sharded source directory, Python-level opens, safetensors opens), counted from now on
    (tokenizers opens files in Rust, unseen here)."""
    source = tmp_path / "llama"
    save_tiny_llama(source, max_shard_size="100KB")
    opens, mapped = Counter(), Counter()
    original = safetensors.safe_open

    def safe_open(file, *args, **kwargs):
        mapped[Path(file).name] += 1
        return original(file, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", safe_open)
    _WATCHED.append((source.resolve(), opens))
    yield source, opens, mapped
    _WATCHED.clear()


def test_the_plan_reads_each_header_once_and_the_import_each_file_once(reads, tmp_path):
    source, opens, mapped = reads
    config = config_from_dict({
        "data": {"tokenizer": {"type": "file", "path": str(source)}},
        "model": {"init_from": {"source": str(source), "prelude": [0, 1], "core": [1, 3],
                                "coda": [3, 4]}},
        "tracking": {"enabled": False}})
    spec = resolve_run(config)
    assert spec.init == {"fingerprint": fingerprint_id(source),
                         "architecture": "LlamaForCausalLM",
                         "layers": {"prelude": [0, 1], "core": [1, 3], "coda": [3, 4]}}
    shards = {p.name for p in source.glob("*.safetensors")}
    assert len(shards) > 1
    assert opens == Counter(dict.fromkeys(
        ["config.json", "tokenizer.json", "model.safetensors.index.json", *shards], 1))
    assert not mapped  # headers only
    opens.clear()

    record = import_stage(spec.config, spec.init, tmp_path / "run", tmp_path / "run" / "init")
    assert {k: record[k] for k in spec.init} == spec.init  # what the plan resolved
    assert mapped == Counter(dict.fromkeys(shards, 1))  # each shard's tensors from one open
    # no header checked again (the plan did; the fingerprint says the files are the same),
    # config.json read once for the model and the tokenizer's BOS/EOS ids alike
    assert {name: opens[name] for name in shards} == dict.fromkeys(shards, 0)
    assert opens["config.json"] == 1 and opens["model.safetensors.index.json"] == 1


def test_the_import_refuses_a_source_changed_after_the_plan(reads, tmp_path):
    source, opens, mapped = reads
    config = config_from_dict({
        "data": {"tokenizer": {"type": "file", "path": str(source)}},
        "model": {"init_from": {"source": str(source)}}, "tracking": {"enabled": False}})
    spec = resolve_run(config)
    shard = sorted(source.glob("*.safetensors"))[0]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
    opens.clear()
    with pytest.raises(DataError) as refused:
        import_stage(spec.config, spec.init, tmp_path / "run", tmp_path / "run" / "init")
    assert str(refused.value) == (
        f"model source {source} changed after the run was planned (fingerprint "
        f"{fingerprint_id(source)}, the run spec's {spec.init['fingerprint']}); re-plan: run "
        "snakemake (or import-hf) again, which checks it anew")
    assert not opens and not mapped and not (tmp_path / "run" / "init").exists()
