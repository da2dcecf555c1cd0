"""One-line errors for config mistakes, under Snakemake and the stage CLI (issue 13, Messages).

Each case runs the real command: a Snakemake dry run of the project's Snakefile (the config
is validated before any job is planned, so a dry run shows exactly what a real run shows) or
``python -m pipeline_lib``. Each asserts the exit status, the one ``error:`` line and its key
text, no traceback, and that nothing was written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.rel_messages import (
    TINY,
    assert_one_line_error,
    entries,
    run_cli,
    run_snakemake,
    write_yaml,
)

# A Snakemake dry run costs ~3 s here: those cases are marked slow (they still run in CI).
snakemake_case = pytest.mark.slow


def _nothing_written(workdir: Path) -> None:
    assert not (workdir / "results").exists() and not (workdir / "logs").exists()


# ---------------------------------------------------------------- Snakemake: the config


@snakemake_case
def test_snakemake_misspelt_key_in_a_variant_names_the_variant_and_the_key(tmp_path):
    bad = write_yaml(tmp_path / "bad.yaml", {"runs": {"loop4": {"train": {"lrr": 0.1}}}})
    result = run_snakemake(tmp_path, "--configfile", TINY, bad)
    assert_one_line_error(result, "runs.loop4: unknown config key 'train.lrr'",
                          "did you mean 'train.lr'?")
    assert len(result.stderr.splitlines()) <= 3  # was 1,684 lines of JSON schema
    _nothing_written(tmp_path)


@snakemake_case
def test_snakemake_misspelt_key_names_the_file_as_the_cli_does(tmp_path):
    bad = write_yaml(tmp_path / "bad.yaml", {"model": {"d_modle": 48}})
    line = assert_one_line_error(run_snakemake(tmp_path, "--configfile", bad),
                                 "bad.yaml: unknown config key 'model.d_modle'",
                                 "did you mean 'model.d_model'?")
    cli = run_cli(tmp_path, "pack", "--config", bad, "--out", tmp_path / "d")
    assert_one_line_error(cli, line.split("bad.yaml", 1)[1])  # the same words after the file
    _nothing_written(tmp_path)
    assert not (tmp_path / "d").exists()


@snakemake_case
def test_snakemake_cross_field_error_in_a_variant_names_the_variant(tmp_path):
    bad = write_yaml(tmp_path / "bad.yaml", {"runs": {"wide": {"model": {"n_heads": 3}}}})
    assert_one_line_error(run_snakemake(tmp_path, "--configfile", TINY, bad),
                          "runs.wide: model.d_model = 32 is not divisible by model.n_heads = 3")
    _nothing_written(tmp_path)


@snakemake_case
def test_snakemake_results_dir_that_is_a_file(tmp_path):
    blocker = tmp_path / "results.txt"
    blocker.write_text("keep me\n")
    for results_dir in (blocker, blocker / "sub"):
        cfg = write_yaml(tmp_path / "r.yaml", {"experiment": {"results_dir": str(results_dir)}})
        assert_one_line_error(run_snakemake(tmp_path, "--configfile", TINY, cfg),
                              "experiment.results_dir", "a file, not a directory")
    assert blocker.read_text() == "keep me\n"
    _nothing_written(tmp_path)


@snakemake_case
def test_snakemake_empty_h_eff_and_zero_val_fraction_are_refused_before_any_job(tmp_path):
    for key, value, text in (("eval", {"h_eff": []}, "eval.h_eff = [] needs at least 1 item"),
                             ("data", {"val_fraction": 0}, "data.val_fraction = 0")):
        cfg = write_yaml(tmp_path / f"{key}.yaml", {key: value})
        line = assert_one_line_error(run_snakemake(tmp_path, "--configfile", TINY, cfg), text)
        assert "--h-eff" not in line
    _nothing_written(tmp_path)


@snakemake_case
def test_snakemake_config_option_in_snakemake_syntax_is_typed_and_validated(tmp_path):
    """Snakemake's --config takes no dotted keys (it refuses train.lr=0.1 itself, before the
    workflow loads); its nested form reaches the loader as strings, which converts them."""
    ok = run_snakemake(tmp_path, "--configfile", TINY, "--config", "train={lr: 0.01}")
    assert ok.returncode == 0, ok.stderr
    assert "Traceback" not in ok.stdout + ok.stderr
    bad = run_snakemake(tmp_path, "--configfile", TINY, "--config", "train={lr: -1}")
    assert_one_line_error(bad, "train.lr = -1.0 must be greater than 0")
    _nothing_written(tmp_path)


@snakemake_case
def test_snakemake_tiny_config_still_plans(tmp_path):
    result = run_snakemake(tmp_path, "--configfile", TINY)
    assert result.returncode == 0, result.stderr
    assert "train_segment" in result.stdout and "error" not in result.stderr.lower()
    _nothing_written(tmp_path)


# ---------------------------------------------------------------- the stage CLI


def test_cli_empty_h_eff_is_refused_at_config_time(tmp_path):
    result = run_cli(tmp_path, "pack", "--config", TINY, "eval.h_eff=[]", "--out", tmp_path / "d")
    assert_one_line_error(result, "eval.h_eff = [] needs at least 1 item")
    assert entries(tmp_path) == []


def test_cli_zero_val_fraction_names_the_config_key(tmp_path):
    result = run_cli(tmp_path, "pack", "--config", TINY, "--out", tmp_path / "d",
                     "data.val_fraction=0")
    assert_one_line_error(result, "config key data.val_fraction = 0.0 must be greater than 0")
    assert entries(tmp_path) == []


def test_cli_misspelt_key_inside_a_variant_names_it(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", {"runs": {"loop4": {"train": {"lrr": 0.1}}}})
    result = run_cli(tmp_path, "pack", "--config", cfg, "--run", "loop4", "--out", tmp_path / "d")
    assert_one_line_error(result, "runs.loop4: unknown config key 'train.lrr'",
                          "did you mean 'train.lr'?")
    assert entries(tmp_path) == ["c.yaml"]


def test_cli_overrides_are_accepted_anywhere_on_the_line(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"{i}.txt").write_text(f"document {i} " * 20)
    cfg = write_yaml(tmp_path / "c.yaml", {"data": {
        "sources": [{"type": "text", "path": str(corpus / "*.txt")}], "curriculum_fraction": 0},
        "train": {"objective": "last"}, "runs": {}})
    out = tmp_path / "d"
    result = run_cli(tmp_path, "pack", "data.seq_len=32", "--config", cfg, "--out", out,
                     "data.epochs=3")
    assert result.returncode == 0, result.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["seq_len"], meta["num_epochs"]) == (32, 3)
    # train: an override after --data (the case) is read, and checked
    train = run_cli(tmp_path, "train", "--config", cfg, "--data", out, "train.nproc=2",
                    "--resume-from", "none", "--until-step", "1", "--out",
                    tmp_path / "run" / "snapshots" / "step_0000001", "--no-track")
    assert_one_line_error(train, "train.micro_batch_rows × train.nproc = 16 × 2;")
    assert not (tmp_path / "run").exists()
    # anything that is not key=value is still refused
    stray = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "e", "stray")
    assert_one_line_error(stray, "override 'stray' must look like key=value")
    assert not (tmp_path / "e").exists()


def test_cli_unknown_override_stays_one_line(tmp_path):
    result = run_cli(tmp_path, "pack", "--out", tmp_path / "d", "model.nope=1")
    assert_one_line_error(result, "unknown config key 'model.nope'")
    assert result.returncode == 2 and entries(tmp_path) == []
