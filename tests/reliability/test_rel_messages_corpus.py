"""Corpus files read once, answers that end, and one-line errors of the eval commands (issue 21).

Real commands in subprocesses (``python -m pipeline_lib pack|train|heff|bench|generate``, a
Snakemake dry run) on inputs written here. Each case asserts the exit status, the one
``error:`` line (or the one warning) and its key text, no traceback, and that nothing was
written (or, for a pack that succeeds, exactly what was packed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from support.rel_messages import (
    TINY,
    assert_one_line_error,
    entries,
    run_cli,
    run_snakemake,
    write_yaml,
)

from pipeline_lib.data.verify import SELF_HASH_KEY, metadata_digest


def _config(path: Path, sources: list[dict], **train: object) -> Path:
    """A config on which pack and a 5-step training run take about a second each."""
    return write_yaml(path, {
        "data": {"sources": sources, "seq_len": 32, "epochs": 1, "val_fraction": 0.5,
                 "curriculum_fraction": 0},
        "model": {"d_model": 16, "n_heads": 2, "loops": 1},
        "train": {"total_steps": 5, "steps_per_segment": 5, "global_batch_rows": 8,
                  "micro_batch_rows": 8, "eval_interval": 0, "diagnostics_interval": 0,
                  "sample_tokens": 0, "warmup_steps": 2, **train},
        "eval": {"h_eff": [1]}, "runs": {}})


def _warnings(stderr: str, text: str) -> list[str]:
    return [line for line in stderr.splitlines() if text in line]


@pytest.fixture(scope="module")
def answer_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reasoning pack, a 5-step snapshot trained with the default answer objective, and a
    plain-text pack (no answer spans) with the same byte tokenizer."""
    root = tmp_path_factory.mktemp("answer_run")
    cfg = _config(root / "c.yaml", [{"type": "reasoning", "num_docs": 200,
                                     "max_difficulty": 2}])
    assert run_cli(root, "pack", "--config", cfg, "--out", root / "data").returncode == 0
    trained = run_cli(root, "train", "--config", cfg, "--data", root / "data", "--resume-from",
                      "none", "--until-step", "5", "--out", root / "snap", "--no-track")
    assert trained.returncode == 0, trained.stderr
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(4):
        (corpus / f"{i}.txt").write_text(f"plain text number {i}\n")
    plain = _config(root / "plain.yaml", [{"type": "text", "path": str(corpus / "*.txt")}],
                    objective="last")
    packed = run_cli(root, "pack", "--config", plain, "--out", root / "plain")
    assert packed.returncode == 0, packed.stderr
    return root


# ---------------------------------------------------------------- corpus files once


def test_a_symlink_loop_in_a_glob_is_not_followed_and_warned_about_once(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.txt").write_text("first document, at the top\n")
    (corpus / "sub" / "b.txt").write_text("second document, one level down\n")
    (corpus / "sub" / "up").symlink_to("..")  # corpus/sub/up/sub/up/… : a loop
    cfg = _config(tmp_path / "c.yaml", [{"type": "text", "path": str(corpus / "**" / "*.txt")}],
                  objective="last")
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    loops = _warnings(result.stderr, "symlinked director")
    assert len(loops) == 1, result.stderr
    assert "did not follow 1 symlinked directory that leads back" in loops[0]
    assert f"{corpus / 'sub' / 'up'} -> {corpus}" in loops[0]
    meta = json.loads((tmp_path / "d" / "metadata.json").read_text())
    assert meta["num_docs"] == 2 and meta["sources"][0]["num_files"] == 2  # was 82 files
    assert meta["sources"][0]["symlink_loops"] == [str(corpus / "sub" / "up")]
    # one training and one validation document, each file once: never the same text twice
    assert meta["total_tokens"] == sum(len(p.read_bytes()) + 1 for p in
                                       [corpus / "a.txt", corpus / "sub" / "b.txt"])


def test_a_file_matched_through_a_link_and_directly_is_read_once(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a", "b", "c"):
        (corpus / f"{name}.txt").write_text(f"document {name}\n")
    (corpus / "z_alias.txt").symlink_to("a.txt")
    cfg = _config(tmp_path / "c.yaml", [{"type": "text", "path": str(corpus / "*.txt")}],
                  objective="last")
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    twice = _warnings(result.stderr, "already matched")
    assert len(twice) == 1, result.stderr
    assert f"{corpus / 'z_alias.txt'} (same file as {corpus / 'a.txt'})" in twice[0]
    meta = json.loads((tmp_path / "d" / "metadata.json").read_text())
    assert meta["num_docs"] == 3 and meta["sources"][0]["duplicate_paths"] == 1


def test_whitespace_only_documents_are_skipped_and_counted_like_empty_ones(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, text in {"a.txt": "real text\n", "b.txt": "  \n\t\n", "c.txt": "",
                       "d.txt": "more real text\n"}.items():
        (corpus / name).write_text(text)
    (corpus / "r.jsonl").write_text("".join(json.dumps({"text": t}) + "\n"
                                            for t in ["one", " \n ", "two", "\t"]))
    cfg = _config(tmp_path / "c.yaml", [{"type": "text", "path": str(corpus / "*.txt")},
                                        {"type": "jsonl", "path": str(corpus / "r.jsonl")}],
                  objective="last")
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert result.returncode == 0, result.stderr
    blank = _warnings(result.stderr, "with no text")
    assert len(blank) == 2, result.stderr  # one per source
    assert "skipped 2 document(s) with no text (an empty or whitespace-only file)" in blank[0]
    assert f"{corpus / 'b.txt'} (1), {corpus / 'c.txt'} (1)" in blank[0]
    assert "skipped 2 document(s) with no text (a null, missing, empty or whitespace-only " \
           "'text')" in blank[1]
    meta = json.loads((tmp_path / "d" / "metadata.json").read_text())
    assert [(s["num_docs"], s["skipped_empty"]) for s in meta["sources"]] == [(2, 2), (2, 2)]
    tokens = np.fromfile(tmp_path / "d" / "tokens.bin", dtype=np.uint16)
    assert bytes(t for t in tokens.tolist() if t < 256).decode() == \
        "real text\nmore real text\nonetwo"


def test_a_whitespace_only_answer_is_a_one_line_error_naming_the_record(tmp_path):
    records = [{"q": "1+1=", "a": "2"}, {"q": "2+2=", "a": " \n"}]
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = _config(tmp_path / "c.yaml", [{"type": "jsonl", "path": str(path),
                                         "prompt_field": "q", "answer_field": "a"}])
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert_one_line_error(result, f"record 2 of {path} has a whitespace-only answer ('a')",
                          "give every record an answer or drop the record")
    assert entries(tmp_path) == ["c.yaml", "qa.jsonl"]


# ---------------------------------------------------------------- answers end


def test_a_pack_with_answer_spans_of_the_old_version_is_refused(answer_run, tmp_path):
    """Spans without the EOS would silently train a model that never stops."""
    old = tmp_path / "packs" / "old"
    old.mkdir(parents=True)
    for item in (answer_run / "data").iterdir():
        (old / item.name).symlink_to(item)  # the arrays as they are
    meta = json.loads((answer_run / "data" / "metadata.json").read_text())
    del meta["answer_span_version"]  # a pack written before version 2
    meta[SELF_HASH_KEY] = metadata_digest({k: v for k, v in meta.items() if k != SELF_HASH_KEY})
    (old / "metadata.json").unlink()
    (old / "metadata.json").write_text(json.dumps(meta))
    result = run_cli(tmp_path, "train", "--config", answer_run / "c.yaml", "--data", old,
                     "--resume-from", "none", "--until-step", "5", "--out",
                     tmp_path / "snap", "--no-track")
    assert_one_line_error(result, f"{old} records answer spans of version 1",
                          "re-run the pack")
    assert entries(tmp_path) == ["packs"]  # no snapshot, no temporary sibling


# ---------------------------------------------------------------- config interpolations


def test_an_interpolation_that_does_not_resolve_is_one_line_under_the_cli(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", {"experiment": {"name": "${nope}"}})
    result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
    assert_one_line_error(result, f"{cfg}: config key 'experiment.name' = '${{nope}}' is an "
                          "interpolation that does not resolve", "write the value itself")
    override = run_cli(tmp_path, "pack", "--out", tmp_path / "d", "train.lr=${oc.env:NO_C21}")
    assert_one_line_error(override, "command-line override: config key 'train.lr'",
                          "Environment variable 'NO_C21' not found")
    assert entries(tmp_path) == ["c.yaml"]


@pytest.mark.slow  # a Snakemake dry run costs ~3 s here
def test_an_interpolation_that_does_not_resolve_is_one_line_under_snakemake(tmp_path):
    cfg = write_yaml(tmp_path / "c.yaml", {"experiment": {"name": "${nope}"}})
    result = run_snakemake(tmp_path, "--configfile", TINY, cfg)
    assert_one_line_error(result, "config key 'experiment.name' = '${nope}' is an "
                          "interpolation that does not resolve")
    assert not (tmp_path / "results").exists() and not (tmp_path / "logs").exists()


# ---------------------------------------------------------------- heff, bench, generate inputs


def test_heff_of_an_answer_snapshot_on_a_pack_without_answers_names_the_objective(answer_run,
                                                                                 tmp_path):
    out = tmp_path / "heff.json"
    result = run_cli(tmp_path, "heff", "--snapshot", answer_run / "snap", "--data",
                     answer_run / "plain", "--out", out, "--no-track")
    line = assert_one_line_error(
        result, "train.objective = answer_deep_supervision scores answer tokens only",
        f"the pack {answer_run / 'plain'} has no answer spans", "sweep a pack with answer spans",
        "train.objective=deep_supervision")
    assert "val_fraction" not in line
    assert entries(tmp_path) == []
    # the fix it names works: every token scored
    fixed = run_cli(tmp_path, "heff", "--snapshot", answer_run / "snap", "--data",
                    answer_run / "plain", "--out", out, "--no-track",
                    "train.objective=deep_supervision")
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(out.read_text())["scored_tokens"] == "all"


@pytest.mark.parametrize(("data", "fragment"), [
    ("data/tokens.bin", "is a file, not a packed data directory; pass {root}/data"),
    ("snap", "is a snapshot, not a packed data directory; pass it as --snapshot"),
])
def test_heff_data_that_is_not_a_pack_says_what_it_is(answer_run, tmp_path, data, fragment):
    result = run_cli(tmp_path, "heff", "--snapshot", answer_run / "snap", "--data",
                     answer_run / data, "--out", tmp_path / "h.json", "--no-track")
    assert_one_line_error(result, fragment.format(root=answer_run))
    assert entries(tmp_path) == []


def test_heff_snapshot_that_is_a_pack_says_what_it_is(answer_run, tmp_path):
    result = run_cli(tmp_path, "heff", "--snapshot", answer_run / "data", "--data",
                     answer_run / "data", "--out", tmp_path / "h.json", "--no-track")
    assert_one_line_error(result, "is a packed data directory, not a snapshot; pass it as "
                          "--data, and as --snapshot a snapshot directory")
    assert entries(tmp_path) == []


def test_heff_out_that_cannot_be_a_file_fails_before_the_sweep(answer_run, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "notes.txt").write_text("keep\n")
    for out, problem in ((tmp_path / "taken", "is a directory"),
                         (tmp_path / "notes.txt" / "h.json", "is a file, not a directory")):
        result = run_cli(tmp_path, "heff", "--snapshot", answer_run / "snap", "--data",
                         answer_run / "data", "--out", out, "--no-track")
        # the stage's output check (pipeline_lib.output_paths) names the path and the problem
        assert_one_line_error(result, str(tmp_path), problem)
    assert entries(tmp_path) == ["notes.txt", "taken"] and entries(tmp_path / "taken") == []


def test_bench_out_and_tasks_dir_mix_ups_fail_before_any_task_file(answer_run, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "notes.txt").write_text("keep\n")
    small = ["--no-track", "bench.tasks=[loopline_parity]", "bench.h_eff=[1]"]
    cases = [(["--out", tmp_path / "taken"], str(tmp_path / "taken"), "is a directory"),
             (["--out", tmp_path / "b.json", "--tasks-dir", tmp_path / "notes.txt"],
              str(tmp_path / "notes.txt"), "is a file, not a directory")]
    for args, *fragments in cases:
        result = run_cli(tmp_path, "bench", "--snapshot", answer_run / "snap", *args, *small)
        assert_one_line_error(result, *fragments)
    assert entries(tmp_path) == ["notes.txt", "taken"] and entries(tmp_path / "taken") == []


@pytest.mark.parametrize(("name", "content", "fragment"), [
    ("bad.jsonl", b'{"prompt": "1+1="}\n{prompt: 2}\n', "bad.jsonl line 2 is not valid JSON"),
    ("utf16.txt", "a=1;print(a)=\n".encode("utf-16"), "utf16.txt is not UTF-8 text (byte 0"),
    ("folder", None, "--prompts-file {path} is a directory"),
    ("empty.jsonl", b"\n", "empty.jsonl holds no prompt"),
])
def test_generate_prompts_file_mistakes_are_one_line(answer_run, tmp_path, name, content,
                                                     fragment):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    result = run_cli(tmp_path, "generate", "--snapshot", answer_run / "snap", "--prompts-file",
                     path)
    assert_one_line_error(result, fragment.format(path=path))
    assert result.stdout == "" and entries(tmp_path) == [name]


def test_generate_reads_a_prompts_file_with_a_byte_order_mark(answer_run, tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"prompt": "a=1;print(a)="}\n')
    result = run_cli(tmp_path, "generate", "--snapshot", answer_run / "snap", "--prompts-file",
                     path, "--max-new-tokens", "2")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["prompt"] == "a=1;print(a)="


def test_config_file_that_is_a_directory_or_not_utf8_is_one_line(tmp_path):
    (tmp_path / "cfgdir").mkdir()
    (tmp_path / "latin1.yaml").write_bytes("experiment: {name: caf\xe9}\n".encode("latin-1"))
    for cfg, fragment in ((tmp_path / "cfgdir", "is a directory; pass a YAML file"),
                          (tmp_path / "latin1.yaml", "is not UTF-8 text (byte 22")):
        result = run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "d")
        assert_one_line_error(result, f"config file {cfg} {fragment}")
    assert sorted(os.listdir(tmp_path)) == ["cfgdir", "latin1.yaml"]
