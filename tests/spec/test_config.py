"""Config loading, merging, validation, and agreement between schema and dataclasses."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from pipeline_lib.errors import ConfigError
from pipeline_lib.spec.config import Config
from pipeline_lib.spec.config_load import (
    DEFAULT_CONFIG_PATH,
    config_for_run,
    config_from_dict,
    load_config,
)
from pipeline_lib.spec.config_write import config_hash, save_config, to_dict
from pipeline_lib.spec.schema import SCHEMA_PATH, build_schema, schema_yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG_FILES = sorted((ROOT / "config").rglob("*.yaml"))


def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(build_schema())


def test_committed_schema_is_generated_from_dataclasses():
    assert SCHEMA_PATH.read_text() == schema_yaml(), (
        "workflow/schemas/config.schema.yaml is stale: run `make schema`")


def test_schema_is_valid_draft_2020_12():
    jsonschema.Draft202012Validator.check_schema(build_schema())


def _schema_keys(schema: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for name, prop in schema["properties"].items():
        if prop.get("type") == "object" and "properties" in prop:
            out.update(_schema_keys(prop, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = prop.get("default", "<object>")
    return out


def _dataclass_keys(obj: object, prefix: str = "") -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            out.update(_dataclass_keys(value, f"{prefix}{f.name}."))
        else:
            plain = [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value] \
                if isinstance(value, list) else value
            out[f"{prefix}{f.name}"] = plain
    return out


def test_schema_and_dataclasses_have_same_keys_and_defaults():
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    assert _schema_keys(schema) == _dataclass_keys(Config())


def test_every_schema_key_has_a_description():
    def walk(node: dict, path: str) -> None:
        for name, prop in node.get("properties", {}).items():
            assert prop.get("description"), f"{path}{name} has no description"
            walk(prop, f"{path}{name}.")
            if isinstance(prop.get("items"), dict):
                walk(prop["items"], f"{path}{name}[].")
        assert node.get("additionalProperties") is False or "properties" not in node

    walk(build_schema(), "")


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_config_file_validates_against_schema_and_dataclasses(path: Path):
    data = yaml.safe_load(path.read_text()) or {}
    _validator().validate(data)
    cfg = load_config(path)
    for run in cfg.runs:
        config_for_run(cfg, run)


def test_default_config_documents_every_key_with_a_comment():
    """Scalars carry an inline comment; sections a comment line above (runs: are examples)."""
    lines = DEFAULT_CONFIG_PATH.read_text().splitlines()
    section = ""
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not line.startswith(" "):
            section = stripped
        if section.startswith("runs:") and line.startswith(" "):
            continue
        if stripped.rstrip(":").lstrip("- ").isidentifier() and stripped.endswith(":"):
            assert lines[i - 1].strip().startswith("#"), f"line {i + 1} needs a comment above"
        else:
            assert " # " in line, f"line {i + 1} has no comment: {line}"


def test_default_has_two_variants_that_differ_in_loops():
    cfg = load_config()
    loops = {config_for_run(cfg, r).model.loops for r in cfg.runs}
    assert len(cfg.runs) >= 2 and len(loops) >= 2


def test_partial_file_merges_over_default_and_overrides_win(tmp_path: Path):
    partial = tmp_path / "x.yaml"
    partial.write_text("model:\n  d_model: 64\ntrain:\n  lr: 0.01\n")
    cfg = load_config(partial, ["train.lr=0.02", "model.loops=7"])
    default = load_config()
    assert cfg.model.d_model == 64
    assert cfg.train.lr == 0.02
    assert cfg.model.loops == 7
    assert cfg.model.n_heads == default.model.n_heads
    assert cfg.runs == default.runs


def test_run_variant_applies_override_and_clears_runs():
    cfg = config_from_dict({"runs": {"deep": {"model": {"loops": 9}}, "shallow": None}})
    deep = config_for_run(cfg, "deep")
    assert deep.model.loops == 9 and deep.runs == {}
    assert config_for_run(cfg, "shallow").model.loops == cfg.model.loops
    with pytest.raises(ConfigError, match="unknown run 'nope'"):
        config_for_run(cfg, "nope")


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        (["model.foo=1"], r"unknown config key 'model\.foo'"),
        (["model.d_model=abc"], r"config key 'model\.d_model'"),
        (["data.seq_len=1"], r"data\.seq_len = 1 is below its minimum 2"),
        (["model.n_heads=5"], r"not divisible by model\.n_heads"),
        (["model.n_kv_heads=3"], r"model\.n_kv_heads = 3 does not divide model\.n_heads = 4; "
                                 r"pick a divisor of n_heads \(0 = n_heads\)"),
        (["model.rope_scaling=ntk"], r"model\.rope_scaling = 'ntk' is not allowed"),
        (["model.learned_positions=16", "data.seq_len=32"],
         r"model\.learned_positions = 16 is shorter than data\.seq_len = 32: .*set "
         r"model\.learned_positions to data\.seq_len"),
        (["model.init=xavier"], r"model\.init = 'xavier' is not allowed"),
        (["train.bptt.mode=sampled"], r"train\.bptt\.mode = 'sampled' is not allowed"),
        (["model.rope_scaling_factor=0"], r"model\.rope_scaling_factor = 0"),
        (["model.moe_experts=2", "model.moe_top_k=3"], r"moe_top_k = 3 must be between 1 and model.moe_experts = 2"),
        (["train.global_batch_rows=12", "train.micro_batch_rows=8"], r"multiple of 8"),
        (["train.optimizer=sgd"], r"train\.optimizer = 'sgd' is not allowed"),
        (["nonsense"], r"key=value"),
        (["eval.adaptive.thresholds=[0,-0.1]"],
         r"eval\.adaptive\.thresholds\[1\] = -0\.1 is below its minimum 0; raise it"),
        (["eval.adaptive.thresholds=[0.01,.nan]"],
         r"eval\.adaptive\.thresholds = nan must be a finite number >= 0"),
        (["eval.adaptive.max_loops=-1"], r"eval\.adaptive\.max_loops = -1 is below its minimum 0"),
        (["eval.adaptive.criteria=[margin]"],
         r"eval\.adaptive\.criteria\[0\] = 'margin' is not allowed"),
        (["eval.adaptive.criteria=[]"], r"eval\.adaptive\.criteria = \[\] needs at least 1"),
        (["bench.adaptive.criteria=[argmax_stable]", "bench.adaptive.thresholds=[0.5]"],
         r"bench\.adaptive\.thresholds \(argmax_stable\) = 0\.5: argmax_stable takes a whole"),
        (["train.objective=expected_exit"],
         r"train\.objective = expected_exit needs the learned exit gate; set model\.exit_gate=true"),
        (["train.objective=expected_exit", "model.exit_gate=true", "train.bptt.mode=unrolled"],
         r"expected_exit weighs every loop's readout in one pass; use train\.bptt\.mode full"),
        (["eval.adaptive.criteria=[kl,gate]"], r"eval\.adaptive\.criteria lists gate, but "
                                                r"model\.exit_gate is false"),
        (["bench.adaptive.criteria=[gate]", "bench.adaptive.thresholds=[0.5]"],
         r"bench\.adaptive\.criteria lists gate, but model\.exit_gate is false"),
        (["eval.adaptive.criterion_thresholds.gate=[0.5,1.5]"],
         r"eval\.adaptive\.criterion_thresholds\.gate = 1\.5: the gate threshold is a "
         r"cumulative exit probability in \[0, 1\]"),
        (["eval.adaptive.criterion_thresholds.argmax_stable=[1.5]"],
         r"argmax_stable takes a whole number n"),
        (["train.optimizer=muon", "train.nproc=2", "train.micro_batch_rows=8"],
         r"train\.optimizer = muon runs in one process, not train\.nproc × train\.nnodes = 2"),
        (["train.optimizer=muon", "train.nnodes=2", "train.micro_batch_rows=8"],
         r"set train\.nproc=1 and train\.nnodes=1"),
        (["train.muon_momentum=1.5"], r"train\.muon_momentum = 1\.5 is above its maximum 1"),
        (["train.freeze=[core,mlp]"], r"train\.freeze\[1\] = 'mlp' is not allowed"),
        (["train.freeze=[head]"], r"train\.freeze lists head, but model\.tie_embeddings shares"),
        (["model.tie_embeddings=false", "model.coda_layers=0", "train.freeze=[coda]"],
         r"train\.freeze lists coda, which this model has no parameters for"),
        (["train.freeze=[adapter]"], r"train\.freeze lists adapter, which this model has no"),
        (["train.freeze=[embeddings,prelude,core,norm]"],
         r"freezes every part of the model; nothing would train"),
        (["train.activation_checkpointing=loop", "train.compile=true"],
         r"train\.activation_checkpointing = loop does not combine with train\.compile"),
        (["train.activation_checkpointing=layer"],
         r"train\.activation_checkpointing = 'layer' is not allowed"),
    ],
)
def test_bad_config_is_one_clear_line(overrides: list[str], pattern: str):
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(None, overrides)
    assert "\n" not in str(info.value)


def test_freeze_accepts_what_the_model_has():
    cfg = load_config(None, ["model.tie_embeddings=true", "train.freeze=[head,embeddings]",
                             "train.optimizer=muon"])
    assert cfg.train.freeze == ["head", "embeddings"] and cfg.train.optimizer == "muon"
    linear = load_config(None, ["model.injection=linear", "model.tie_embeddings=false",
                                "model.coda_layers=1",
                                "train.freeze=[embeddings,prelude,coda,head,norm]"])
    assert linear.train.freeze[-1] == "norm"  # core and the adapter still train
    load_config(None, ["model.learn_injection_scale=true", "train.freeze=[adapter]"])


def test_bad_run_name_and_missing_file(tmp_path: Path):
    with pytest.raises(ConfigError, match="identifiers other than 'data'"):
        config_from_dict({"runs": {"data": {}}})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.parametrize("name", ["base\n", "data\n", "compare\n"])
def test_a_run_name_with_a_trailing_newline_is_refused_in_one_line(tmp_path: Path,
                                                                   name: str) -> None:
    """``re.match`` with ``$`` let "base\\n" through (``$`` matches before a final newline;
    issue 39, class 8): a quoted YAML key is enough to make one."""
    path = tmp_path / "c.yaml"
    path.write_text(f"runs:\n  {json.dumps(name)}: {{}}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == (f"runs.{name!r}: run names must be identifiers other than "
                                  "'data' and 'compare' (letters, digits, underscores)")


def test_save_and_reload_round_trip_and_hash(tmp_path: Path):
    cfg = load_config(None, ["model.loops=3"])
    save_config(cfg, tmp_path / "c.yaml")
    again = load_config(tmp_path / "c.yaml", base=None)
    assert to_dict(again) == to_dict(cfg)
    assert config_hash(again) == config_hash(cfg)
    assert config_hash(load_config(None, ["model.loops=5"])) != config_hash(cfg)


def test_config_import_stays_light():
    code = ("import sys, pipeline_lib.spec.config, pipeline_lib.workflow.plan; "
            "heavy = [m for m in ('torch', 'mlflow', 'lm_eval', 'pyarrow') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_file_with_runs_replaces_the_default_variants(tmp_path: Path):
    partial = tmp_path / "x.yaml"
    partial.write_text("runs:\n  only:\n    model: {loops: 3}\n")
    assert list(load_config(partial).runs) == ["only"]
    partial.write_text("model: {loops: 3}\n")
    assert load_config(partial).runs == load_config().runs


def test_snakemake_config_merge_matches_the_loader(tmp_path: Path):
    from pipeline_lib.spec.config_load import merge_config_dicts, merge_config_files

    first = {"model": {"d_model": 64}, "runs": {"a": {"model": {"loops": 2}}},
             "data": {"sources": [{"type": "reasoning"}]}}
    second = {"model": {"n_heads": 2}, "runs": {"b": {}}, "train": {"lr": 0.002}}
    (tmp_path / "1.yaml").write_text(yaml.safe_dump(first))
    (tmp_path / "2.yaml").write_text(yaml.safe_dump(second))
    files = [tmp_path / "1.yaml", tmp_path / "2.yaml"]
    merged = merge_config_files(files, DEFAULT_CONFIG_PATH)
    assert merged["runs"] == {"b": {}}  # the later file's variants replace the earlier's
    assert config_from_dict(merged) == load_config(files)
    cfg = load_config(files)
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.train.lr, list(cfg.runs)) == \
        (64, 2, 0.002, ["b"])
    assert load_config(files[:1]) == load_config(files[0])  # one file, as a list or alone
    assert merge_config_dicts({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2]}}) == \
        {"a": {"b": 1, "c": [2]}}


_STDLIB = {"type": "stdlib"}
_JSONL = {"type": "jsonl", "path": "x/*.jsonl"}


@pytest.mark.parametrize(
    ("data", "train", "pattern"),
    [
        ({"sources": [_STDLIB, {**_JSONL, "prompt_field": "q"}]}, {},
         r"data\.sources\[1\]\.prompt_field is set without answer_field; set both"),
        ({"sources": [{**_JSONL, "answer_field": "a"}]}, {},
         r"data\.sources\[0\]\.answer_field is set without prompt_field"),
        ({"sources": [{"type": "text", "path": "t/*", "level_field": "k"}]}, {},
         r"data\.sources\[0\]\.level_field is set on a text source; only jsonl and parquet"),
        ({"sources": [_STDLIB, _JSONL], "curriculum_fraction": 0.5}, {},
         r"data\.curriculum_fraction = 0\.5 orders documents by level, but no source has levels"),
        ({"curriculum_fraction": 1.5}, {}, r"data\.curriculum_fraction = 1\.5 is above its maximum"),
        ({"sources": [_STDLIB, {**_JSONL, "level_field": "k"}]}, {"objective": "answer_last"},
         r"train\.objective = answer_last scores answer tokens only, but no source has answers"),
        ({}, {"objective": "answer_only"}, r"train\.objective = 'answer_only' is not allowed"),
        ({}, {"loop_sampling": {"ramp_steps": -1}},
         r"train\.loop_sampling\.ramp_steps = -1 is below its minimum 0"),
    ],
)
def test_bad_curriculum_and_answer_settings_are_one_line(data: dict, train: dict, pattern: str):
    with pytest.raises(ConfigError, match=pattern) as info:
        config_from_dict({"data": data, "train": train})
    assert "\n" not in str(info.value)


_TASKS = {"type": "labelled", "tasks": ["prefix_parity", "chain_root"]}


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"sources": [{"type": "reasoning", "tasks": ["khop", "chain_root"]}]},
         r"data\.sources\[0\]\.tasks lists 'chain_root', which is not a reasoning task; a "
         r"reasoning source draws from \['khop', 'addition', 'parity'\]"),
        ({"sources": [{"type": "labelled"}]},  # the default tasks are reasoning's
         r"data\.sources\[0\]\.tasks lists 'khop', which is not a labelled task; a labelled "
         r"source draws from \['prefix_parity', 'chain_root'\]: list only those"),
        ({"sources": [_TASKS, _STDLIB]},
         r"data\.sources\[0\] is labelled but data\.sources\[1\] \(stdlib\) is not: a pack "
         r"is labelled or not"),
        ({"sources": [_TASKS], "tokenizer": {"type": "bpe"}},
         r"data\.tokenizer\.type = bpe trains its vocabulary on the corpus text"),
        ({"val_fraction": 0},
         r"config key data\.val_fraction = 0\.0 must be greater than 0 unless a source is "
         r"heldout"),
    ],
)
def test_bad_labelled_and_heldout_settings_are_one_line(data: dict, pattern: str):
    with pytest.raises(ConfigError, match=pattern) as info:
        config_from_dict({"data": data})
    assert "\n" not in str(info.value)


def test_labelled_sources_and_a_heldout_test_set_load(tmp_path: Path):
    cfg = config_from_dict({"data": {"val_fraction": 0, "sources": [
        {"type": "labelled", "path": "train/*.jsonl", "tasks": ["khop"]},  # a path: no tasks
        {"type": "labelled", "path": "test.jsonl", "heldout": True}]}})
    assert [s.heldout for s in cfg.data.sources] == [False, True]
    assert cfg.data.val_fraction == 0
    # The default objective (answer_deep_supervision) scores the labelled tokens, and the
    # curriculum orders them by level: neither is switched off for labelled data.
    path = tmp_path / "labelled.yaml"
    path.write_text(yaml.safe_dump({"data": {"sources": [_TASKS]}}))
    built_in, default = load_config(path), load_config()
    assert built_in.train.objective == default.train.objective == "answer_deep_supervision"
    assert built_in.data.curriculum_fraction == default.data.curriculum_fraction > 0


def test_answer_objectives_and_curricula_accept_sources_that_have_them():
    qa = {**_JSONL, "prompt_field": "q", "answer_field": "a", "level_field": "k"}
    for objective in ("answer_last", "answer_deep_supervision"):
        cfg = config_from_dict({"data": {"sources": [qa], "curriculum_fraction": 0.25},
                                "train": {"objective": objective}})
        assert cfg.train.objective == objective and cfg.data.curriculum_fraction == 0.25
    reasoning = config_from_dict({"data": {"sources": [{"type": "reasoning"}],
                                           "curriculum_fraction": 1.0},
                                  "train": {"objective": "answer_last",
                                            "loop_sampling": {"ramp_steps": 100}}})
    assert reasoning.train.loop_sampling.ramp_steps == 100


def test_bench_include_path_and_level_field_defaults_and_no_filesystem_check(tmp_path: Path):
    """The folder is checked where the workflow or a bench job starts (pipeline_lib.task_catalog),
    not by load_config: a snapshot's config.yaml must load on a machine without the folder."""
    cfg = load_config()
    assert (cfg.bench.include_path, cfg.bench.level_field) == ("", "level")
    gone = load_config(None, [f"bench.include_path={tmp_path / 'gone'}", "bench.tasks=[mine]",
                              "bench.level_field=hops"])
    assert gone.bench.include_path == str(tmp_path / "gone") and gone.bench.level_field == "hops"


@pytest.mark.parametrize(
    ("tokenizer", "pattern"),
    [
        ({"type": "file"}, r"data\.tokenizer\.path is empty for a file tokenizer; set it"),
        ({"type": "byte", "path": "tok.json"},
         r"data\.tokenizer\.path is set for a byte tokenizer; only type file reads it"),
        ({"type": "bpe", "add_bos": True},
         r"data\.tokenizer\.add_bos = true, but a bpe tokenizer has no BOS token"),
        ({"type": "file", "path": "t.json", "add_bos": "yes"},
         r"data\.tokenizer\.add_bos = 'yes' is not allowed; use one of \['auto', 'true', 'false'\]"),
    ],
)
def test_bad_tokenizer_settings_are_one_line(tokenizer: dict, pattern: str):
    with pytest.raises(ConfigError, match=pattern) as info:
        config_from_dict({"data": {"tokenizer": tokenizer}})
    assert "\n" not in str(info.value)


def test_file_tokenizer_settings_load_without_touching_the_file(tmp_path: Path):
    """YAML booleans are accepted for add_bos; the path is checked by the pack, not here (a
    snapshot's config.yaml must load where the tokenizer file is absent)."""
    path = tmp_path / "gone" / "tokenizer.json"
    for given, expected in [(True, "true"), (False, "false"), ("auto", "auto")]:
        cfg = config_from_dict({"data": {"tokenizer": {"type": "file", "path": str(path),
                                                       "add_bos": given}}})
        assert (cfg.data.tokenizer.path, cfg.data.tokenizer.add_bos) == (str(path), expected)
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"data:\n  tokenizer:\n    type: file\n    path: {path}\n    add_bos: true\n")
    assert load_config(yaml_file).data.tokenizer.add_bos == "true"
    assert load_config(None, [f"data.tokenizer.path={path}", "data.tokenizer.type=file",
                              "data.tokenizer.add_bos=false"]).data.tokenizer.add_bos == "false"
