"""One-line errors and single warnings of the data and training stages (issue 13, Messages).

Real commands in subprocesses (``python -m pipeline_lib pack|train``) on corpora written
here; a full disk is a real size-limited tmpfs (in a user namespace) or a real file-size
limit, never a mock. Each case asserts the exit status, the message, no traceback, and that
nothing was half-written or lost.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.rel_messages import (
    TINY,
    assert_one_line_error,
    command_env,
    entries,
    run_cli,
    write_yaml,
)


def _text_corpus(directory: Path, texts: list[str]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    for i, text in enumerate(texts):
        (directory / f"doc{i}.txt").write_text(text)
    return str(directory / "*.txt")


def _small_config(path: Path, sources: list[dict], **data: object) -> Path:
    """A config on which pack and a 30-step training run take about a second each."""
    return write_yaml(path, {
        "data": {"sources": sources, "seq_len": 16, "epochs": 1, "val_fraction": 0.5,
                 "curriculum_fraction": 0, **data},
        "model": {"d_model": 16, "n_heads": 2, "loops": 1},
        "train": {"total_steps": 30, "steps_per_segment": 30, "global_batch_rows": 8,
                  "micro_batch_rows": 8, "eval_interval": 0, "diagnostics_interval": 0,
                  "sample_tokens": 0, "warmup_steps": 2, "objective": "last"},
        "eval": {"h_eff": [1]}, "runs": {}})


@pytest.fixture(scope="module")
def two_doc_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-document corpus packed (one training document: one row per epoch) and trained
    for 30 steps of 8 rows, i.e. through 240 epochs; the train command's output is kept."""
    root = tmp_path_factory.mktemp("two_docs")
    glob = _text_corpus(root / "corpus", ["def f():\n    return 1\n", "x = 2\nprint(x)\n"])
    cfg = _small_config(root / "c.yaml", [{"type": "text", "path": glob}])
    packed = run_cli(root, "pack", "--config", cfg, "--out", root / "data")
    assert packed.returncode == 0, packed.stderr
    trained = run_cli(root, "train", "--config", cfg, "--data", root / "data", "--resume-from",
                      "none", "--until-step", "30", "--out",
                      root / "run" / "snapshots" / "step_0000030", "--no-track")
    assert trained.returncode == 0, trained.stderr
    (root / "train.stderr").write_text(trained.stderr)
    return root


# ---------------------------------------------------------------- a full disk during pack


def test_pack_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """A 300 KiB tmpfs (the tiny corpus needs ~750 KiB): ENOSPC in the middle of tokens.bin."""
    unshare = shutil.which("unshare")
    if unshare is None or subprocess.run([unshare, "-rm", "true"]).returncode != 0:
        pytest.skip("needs unshare -rm (user and mount namespaces) to mount a small tmpfs")
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (f'mount -t tmpfs -o size=300k tmpfs "{disk}" || exit 99; mkdir "{disk}/data"; '
              f'"{sys.executable}" -m pipeline_lib pack --config "{TINY}" '
              f'--out "{disk}/data/pack"; rc=$?; echo "LEFT:$(ls -A "{disk}/data")"; exit $rc')
    result = subprocess.run([unshare, "-rm", "sh", "-c", script], capture_output=True,
                            text=True, cwd=tmp_path, env=command_env(tmp_path), timeout=300)
    if result.returncode == 99:
        pytest.skip("cannot mount a tmpfs in a user namespace here")
    assert_one_line_error(result, "cannot write the data pack", "No space left on device",
                          "free space")
    assert "LEFT:\n" in result.stdout  # no pack, no temporary sibling


def test_pack_past_a_file_size_limit_keeps_the_previous_pack(tmp_path):
    """A re-pack that cannot write (EFBIG, like ENOSPC) leaves the existing pack intact."""
    out = tmp_path / "data" / "pack"
    small = write_yaml(tmp_path / "small.yaml", {"data": {
        "sources": [{"type": "reasoning", "num_docs": 40}], "seq_len": 32, "epochs": 1,
        "curriculum_fraction": 0}, "runs": {}})
    first = run_cli(tmp_path, "pack", "--config", small, "--out", out)
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = run_cli(tmp_path, "pack", "--config", TINY, "--out", out,
                     limit_file_bytes=100_000)
    assert_one_line_error(result, f"cannot write the data pack {out}", "File too large")
    assert entries(out.parent) == ["pack"]  # no temporary or old sibling left
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_pack_below_a_file_is_one_line(tmp_path):
    (tmp_path / "results").write_text("not a directory\n")
    result = run_cli(tmp_path, "pack", "--config", TINY, "--out", tmp_path / "results" / "d")
    assert_one_line_error(result, f"--out {tmp_path / 'results' / 'd'}",
                          f"{tmp_path / 'results'} is a file, not a directory")
    assert (tmp_path / "results").read_text() == "not a directory\n"


# ---------------------------------------------------------------- corpus problems


def test_one_document_corpus_is_refused_at_pack_time(tmp_path):
    glob = _text_corpus(tmp_path / "corpus", ["only one document here\n"])
    cfg = _small_config(tmp_path / "c.yaml", [{"type": "text", "path": glob}])
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "data" / "d")
    assert_one_line_error(result, "the corpus has 1 document", "data.val_fraction = 0.5",
                          "holds out nothing for validation")
    assert entries(tmp_path / "data") == []


def test_null_texts_are_skipped_and_warned_about_once_with_their_files(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = {"a.jsonl": ["one", None, "two", None, ""], "b.jsonl": ["three", None, "four"]}
    for name, texts in rows.items():
        (corpus / name).write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = _small_config(tmp_path / "c.yaml", [{"type": "jsonl", "path": str(corpus / "*.jsonl")}])
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "no text" in line]
    assert len(warnings) == 1, result.stderr
    assert ("skipped 4 document(s) with no text (a null, missing, empty or whitespace-only "
            "'text')") in warnings[0]
    assert f"{corpus / 'a.jsonl'} (3), {corpus / 'b.jsonl'} (1)" in warnings[0]
    source = json.loads((tmp_path / "d" / "metadata.json").read_text())["sources"][0]
    assert (source["num_docs"], source["skipped_empty"]) == (4, 4)
    assert source["skipped_empty_files"] == {str(corpus / "a.jsonl"): 3,
                                             str(corpus / "b.jsonl"): 1}


def test_binary_files_are_decoded_and_warned_about_once_with_their_names(tmp_path):
    glob = _text_corpus(tmp_path / "corpus", ["plain text one\n", "plain text two\n"])
    (tmp_path / "corpus" / "image.txt").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "corpus" / "zz.txt").write_bytes(b"caf\xe9 latin-1\n")
    cfg = _small_config(tmp_path / "c.yaml", [{"type": "text", "path": glob}])
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "UTF-8" in line]
    assert len(warnings) == 1, result.stderr
    assert "2 document(s) are not valid UTF-8 (binary files?)" in warnings[0]
    assert (f"{tmp_path / 'corpus' / 'image.txt'} (1), {tmp_path / 'corpus' / 'zz.txt'} (1)"
            in warnings[0])
    meta = json.loads((tmp_path / "d" / "metadata.json").read_text())
    assert (meta["num_docs"], meta["invalid_utf8_docs"]) == (4, 2)


def test_epoch_wrap_around_is_warned_about_once_then_summarised(two_doc_run):
    stderr = (two_doc_run / "train.stderr").read_text()
    wraps = [line for line in stderr.splitlines() if "data stream" in line]
    assert len(wraps) == 3, wraps  # was one line per epoch: 239
    assert "entered epoch 1 but only 1 epochs are packed" in wraps[0]
    assert "10 times so far" in wraps[1] and "100 times so far" in wraps[2]
    assert (two_doc_run / "run" / "snapshots" / "step_0000030" / "MANIFEST.json").is_file()


# ---------------------------------------------------------------- --resume-from mix-ups


@pytest.mark.parametrize(("resume", "expected"), [
    ("data", "is a packed data directory, not a snapshot; pass it as --data"),
    ("run", "is a run directory, not a snapshot; pass"),
    ("run/snapshots", "holds snapshots but is not one; pass one of them, e.g. "),
    ("corpus", "is not a snapshot (no MANIFEST.json, no snapshot files)"),
])
def test_resume_from_a_directory_that_is_not_a_snapshot_says_what_it_is(two_doc_run, tmp_path,
                                                                         resume, expected):
    result = run_cli(tmp_path, "train", "--config", two_doc_run / "c.yaml", "--data",
                     two_doc_run / "data", "--resume-from", two_doc_run / resume,
                     "--until-step", "60", "--out", tmp_path / "snapshots" / "step_0000060",
                     "--no-track")
    line = assert_one_line_error(result, expected)
    assert "interrupted" not in line
    if resume == "run/snapshots":
        assert line.endswith("step_0000030")
    assert entries(tmp_path) == []


def test_resume_from_a_snapshot_without_its_manifest_is_still_incomplete(two_doc_run, tmp_path):
    snap = tmp_path / "step_0000030"
    shutil.copytree(two_doc_run / "run" / "snapshots" / "step_0000030", snap)
    (snap / "MANIFEST.json").unlink()
    result = run_cli(tmp_path, "train", "--config", two_doc_run / "c.yaml", "--data",
                     two_doc_run / "data", "--resume-from", snap, "--until-step", "60",
                     "--out", tmp_path / "out" / "step_0000060", "--no-track")
    assert_one_line_error(result, "is incomplete: MANIFEST.json is missing")
    assert entries(tmp_path) == ["step_0000030"]
