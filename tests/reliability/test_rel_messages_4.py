"""One-line errors with the right fix, and the last pass's leftovers (issue 29, classes 6–7).

Real commands in subprocesses (``python -m pipeline_lib …``, a Snakemake dry run) on a pack,
a snapshot and an export made here. Each case asserts the exit status, the one ``error:``
line and its key text (the fix it gives, and not the wrong one it gave), no traceback, and
that nothing was written or changed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from support.rel_messages import (
    assert_ok,
    assert_one_line_error,
    command_env,
    entries,
    plain_corpus,
    quick_config,
    run_cli,
    run_snakemake,
    write_yaml,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte pack, ``snap`` (5 steps, no EMA) and ``export`` (its Hugging Face export)."""
    root = tmp_path_factory.mktemp("messages4")
    cfg = quick_config(root / "c.yaml", plain_corpus(root / "corpus"), loops=2)
    assert_ok(run_cli(root, "pack", "--config", cfg, "--out", root / "data"))
    assert_ok(run_cli(root, "train", "--config", cfg, "--data", root / "data", "--resume-from",
                      "none", "--until-step", "5", "--out", root / "snap", "--no-track"))
    assert_ok(run_cli(root, "export", "--snapshot", root / "snap", "--out", root / "export"))
    return root


def _generate(workdir: Path, snap: Path, *args: str | bytes, stdin: bytes | None = None,
              timeout: int = 120) -> subprocess.CompletedProcess:
    """``generate`` with raw bytes allowed in argv and on stdin (as a shell passes them)."""
    done = subprocess.run([sys.executable, "-m", "pipeline_lib", "generate", "--snapshot",
                           str(snap), *args], input=stdin if stdin is not None else b"",
                          capture_output=True, cwd=workdir, env=command_env(workdir),
                          timeout=timeout)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(),
                                       done.stderr.decode(errors="replace"))


# ---------------------------------------------------------------- 6: generate's numbers


def test_a_tiny_temperature_samples_the_top_token(run, tmp_path):
    greedy = run_cli(tmp_path, "generate", "--snapshot", run / "snap", "--prompt", "plain",
                     "--max-new-tokens", "6")
    assert_ok(greedy)
    for temperature in ("1e-300", "5e-324"):  # 1/T overflows; the smallest subnormal
        tiny = run_cli(tmp_path, "generate", "--snapshot", run / "snap", "--prompt", "plain",
                       "--max-new-tokens", "6", "--temperature", temperature)
        assert_ok(tiny)
        assert tiny.stdout == greedy.stdout  # no tie in these logits: the top token each time


def test_an_h_eff_past_the_bound_is_refused_at_once(run, tmp_path):
    for args in (["--h-eff", "200000"], ["--adaptive", "0.1:200000"]):
        result = run_cli(tmp_path, "generate", "--snapshot", run / "snap", "--prompt", "a",
                         *args, timeout=60)  # ran for ever before
        assert_one_line_error(result, "= 200000: a test-time loop count must lie between 1 "
                              "and 1024")
    heff = run_cli(tmp_path, "heff", "--snapshot", run / "snap", "--data", run / "data",
                   "--out", tmp_path / "h.json", "--h-eff", "1,5000", "--no-track", timeout=60)
    assert_one_line_error(heff, "--h-eff = 5000", "between 1 and 1024")
    assert entries(tmp_path) == []


# ---------------------------------------------------------------- 6: the right fix


def test_use_ema_without_an_ema_names_the_option_and_the_training_key(run, tmp_path):
    for command in (["export", "--out", tmp_path / "x"], ["generate", "--prompt", "a"]):
        result = run_cli(tmp_path, *command, "--snapshot", run / "snap", "--use-ema")
        line = assert_one_line_error(result, "has no 'ema' weights", "leave out --use-ema",
                                     "train.ema_decay")
        assert "which=" not in line
    assert entries(tmp_path) == []


def test_a_missing_tokenizer_option_is_not_a_missing_pack(run, tmp_path):
    for command in (["export", "--out", tmp_path / "x"], ["generate", "--prompt", "a"]):
        result = run_cli(tmp_path, *command, "--snapshot", run / "snap", "--tokenizer",
                         tmp_path / "missing.json")
        line = assert_one_line_error(result, f"--tokenizer {tmp_path / 'missing.json'}",
                                     "does not exist", "leave it out")
        assert "pack the data" not in line
    assert entries(tmp_path) == []


def test_a_manifest_missing_the_weights_entry_does_not_say_delete_them(run, tmp_path):
    snap = tmp_path / "snap"
    shutil.copytree(run / "snap", snap)
    manifest = json.loads((snap / "MANIFEST.json").read_text())
    del manifest["files"]["model.safetensors"]
    (snap / "MANIFEST.json").write_text(json.dumps(manifest))
    weights = (snap / "model.safetensors").read_bytes()
    result = run_cli(tmp_path, "generate", "--snapshot", snap, "--prompt", "a")
    line = assert_one_line_error(result, "MANIFEST.json does not list model.safetensors",
                                 "MANIFEST.json is damaged", "keep model.safetensors")
    assert "remove it" not in line
    assert (snap / "model.safetensors").read_bytes() == weights
    # a file the user put there is still theirs to move out
    (snap / "notes.txt").write_text("mine\n")
    (snap / "MANIFEST.json").write_text((run / "snap" / "MANIFEST.json").read_text())
    stray = run_cli(tmp_path, "generate", "--snapshot", snap, "--prompt", "a")
    assert_one_line_error(stray, "holds notes.txt", "move it out of the snapshot")


def test_compare_of_a_file_says_it_takes_run_directories(run, tmp_path):
    cfg = write_yaml(tmp_path / "some.yaml", {"model": {"loops": 2}})
    result = run_cli(tmp_path, "compare", cfg, "--out", tmp_path / "cmp")
    line = assert_one_line_error(result, "compare takes run directories", f"{cfg} is a file")
    assert "finish training" not in line
    assert entries(tmp_path) == ["some.yaml"]


def test_an_export_given_as_snapshot_is_called_an_export(run, tmp_path):
    result = run_cli(tmp_path, "generate", "--snapshot", run / "export", "--prompt", "a")
    line = assert_one_line_error(result, f"{run / 'export'} is a Hugging Face export of a "
                                 "snapshot", "pass as --snapshot the snapshot it was exported")
    assert "interrupted" not in line and "incomplete" not in line


# ---------------------------------------------------------------- 7: prompts and corpus files


def test_prompts_that_are_not_utf8_are_one_line(run, tmp_path):
    piped = _generate(tmp_path, run / "snap", "--max-new-tokens", "2", stdin=b"ab\xff\xfecd\n")
    assert_one_line_error(piped, "stdin is not UTF-8 text (byte 2")
    given = _generate(tmp_path, run / "snap", "--max-new-tokens", "2", "--prompt", b"a\xffb")
    assert_one_line_error(given, "--prompt is not UTF-8 text (byte 1")
    assert piped.stdout == given.stdout == ""
    fine = _generate(tmp_path, run / "snap", "--max-new-tokens", "2",
                     stdin="héllo\n".encode())
    assert_ok(fine)
    assert json.loads(fine.stdout)["prompt"] == "héllo"


def test_a_corpus_file_that_cannot_be_read_is_one_line_before_the_pack(tmp_path):
    """chmod 000 stops only other users: as root, the pack runs as nobody (uid 65534)."""
    root = Path(tempfile.mkdtemp(prefix="unreadable", dir="/tmp"))  # tmp_path is root-only
    try:
        os.chmod(root, 0o777)
        corpus = plain_corpus(root / "corpus", 4)
        os.chmod(corpus / "2.txt", 0o000)
        cfg = write_yaml(root / "c.yaml", {"data": {"sources": [
            {"type": "text", "path": str(corpus / "*.txt")}], "curriculum_fraction": 0},
            "train": {"objective": "last"}})
        for p in (corpus, cfg):
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        if os.geteuid() == 0 and not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv (util-linux) to drop privileges")
        result = subprocess.run([*(as_nobody if os.geteuid() == 0 else []), sys.executable,
                                 "-m", "pipeline_lib", "pack", "--config", str(cfg), "--out",
                                 str(root / "data")], capture_output=True, text=True, cwd=root,
                                env=command_env(root), timeout=300)
        assert_one_line_error(result, f"cannot read {corpus / '2.txt'} (Permission denied)",
                              "data.sources[0]", "chmod a+r")
        assert not (root / "data").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- 7: config files


@pytest.mark.parametrize(("text", "fragments"), [
    ("model: [1, 2]\n", ["config key 'model' must be a section (a mapping of keys), not list"]),
    ("train:\n  spike: 3\n", ["config key 'train.spike' must be a section", "not int 3"]),
    ("data:\n  sources: {type: text}\n", ["config key 'data.sources' must be a list"]),
])
def test_a_section_of_the_wrong_kind_names_its_key(tmp_path, text, fragments):
    (tmp_path / "bad.yaml").write_text(text)
    result = run_cli(tmp_path, "pack", "--config", tmp_path / "bad.yaml", "--out", tmp_path / "d")
    line = assert_one_line_error(result, "bad.yaml", *fragments)
    assert "'?'" not in line
    assert entries(tmp_path) == ["bad.yaml"]


def test_a_yaml_syntax_error_gives_its_line_and_column(tmp_path):
    (tmp_path / "bad.yaml").write_text("model:\n  loops: 3\n d_model: 4\n")
    result = run_cli(tmp_path, "pack", "--config", tmp_path / "bad.yaml", "--out", tmp_path / "d")
    assert_one_line_error(result, "bad.yaml is not valid YAML at line 3, column 2",
                          "did not find expected key")
    assert entries(tmp_path) == ["bad.yaml"]


def test_defaults_that_need_levels_and_answers_follow_a_plain_corpus(tmp_path):
    """``data.sources`` alone: the default curriculum and answer objective stand down."""
    cfg = write_yaml(tmp_path / "plain.yaml", {"data": {"sources": [
        {"type": "text", "path": str(plain_corpus(tmp_path / "corpus") / "*.txt")}]}})
    assert_ok(run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "data"))
    from pipeline_lib.spec.config_load import load_config

    resolved = load_config(cfg)
    assert (resolved.data.curriculum_fraction, resolved.train.objective) == (
        0.0, "deep_supervision")
    # set by the user, they stay and are refused as before
    asked = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d2",
                    "data.curriculum_fraction=0.3")
    assert_one_line_error(asked, "data.curriculum_fraction = 0.3 orders documents by level")
    assert not (tmp_path / "d2").exists()


@pytest.mark.slow  # a Snakemake dry run (~3 s)
def test_defaults_follow_a_plain_corpus_under_snakemake(tmp_path):
    cfg = write_yaml(tmp_path / "plain.yaml", {"data": {"sources": [
        {"type": "text", "path": str(plain_corpus(tmp_path / "corpus") / "*.txt")}]}})
    result = run_snakemake(tmp_path, "--configfile", cfg)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "error:" not in result.stderr
