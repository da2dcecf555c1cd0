"""Compatibility judged by identities, not sizes (issue 29, class 5).

Real commands in subprocesses on packs and snapshots made here: a snapshot trained on a BPE
tokenizer (300 ids) against a byte-tokenizer pack (258 ids: they fit, so only the
tokenizer's identity can tell); a model whose exit gate no objective trained; two training
runs whose ``--out`` lie in one folder. Each asserts the exit status, the one ``error:``
line naming both sides and the fix, no traceback, and that nothing was written or lost.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.rel_messages import (
    TINY,
    assert_ok,
    assert_one_line_error,
    entries,
    plain_corpus,
    quick_config,
    run_cli,
    run_snakemake,
    write_yaml,
)

BPE = ["data.tokenizer.type=bpe", "data.tokenizer.vocab_size=300"]


@pytest.fixture(scope="module")
def packs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``byte/`` and ``bpe/`` packs of one corpus, and ``run/bpe_snap``: 5 steps on ``bpe``."""
    root = tmp_path_factory.mktemp("identity")
    cfg = quick_config(root / "c.yaml", plain_corpus(root / "corpus"), total_steps=10)
    assert_ok(run_cli(root, "pack", "--config", cfg, "--out", root / "byte"))
    assert_ok(run_cli(root, "pack", "--config", cfg, "--out", root / "bpe", *BPE))
    assert_ok(run_cli(root, "train", "--config", cfg, "--data", root / "bpe", "--resume-from",
                      "none", "--until-step", "5", "--out", root / "run" / "bpe_snap",
                      "--no-track", *BPE))
    return root


# ---------------------------------------------------------------- the tokenizer's identity


def test_heff_of_a_snapshot_on_a_pack_of_another_tokenizer_names_both(packs, tmp_path):
    snap, byte = packs / "run" / "bpe_snap", packs / "byte"
    result = run_cli(tmp_path, "heff", "--snapshot", snap, "--data", byte, "--out",
                     tmp_path / "h.json", "--no-track")  # 258 ids fit in 300 rows: exit 0 before
    assert_one_line_error(result, f"snapshot {snap} was trained on the bpe tokenizer (300 ids)",
                          f"the pack {byte} holds the byte tokenizer (258 ids)",
                          "data.tokenizer: {type: file, path: "
                          f"{snap / 'tokenizer.json'}}}")
    assert entries(tmp_path) == []
    # the fix it names works: the corpus packed with the snapshot's own tokenizer
    cfg = packs / "c.yaml"
    assert_ok(run_cli(tmp_path, "pack", "--config", cfg, "--out", tmp_path / "same",
                      "data.tokenizer.type=file", f"data.tokenizer.path={snap / 'tokenizer.json'}"))
    assert_ok(run_cli(tmp_path, "heff", "--snapshot", snap, "--data", tmp_path / "same", "--out",
                      tmp_path / "h.json", "--no-track"))
    assert json.loads((tmp_path / "h.json").read_text())["tokens"] > 0


def test_a_damaged_tokenizer_file_is_named_as_damaged_not_as_another_tokenizer(packs,
                                                                              tmp_path):
    snap = tmp_path / "snap"
    shutil.copytree(packs / "run" / "bpe_snap", snap)
    blob = bytearray((snap / "tokenizer.json").read_bytes())
    blob[len(blob) // 2] ^= 1
    (snap / "tokenizer.json").write_bytes(bytes(blob))
    result = run_cli(tmp_path, "heff", "--snapshot", snap, "--data", packs / "bpe", "--out",
                     tmp_path / "h.json", "--no-track")
    line = assert_one_line_error(result, "tokenizer.json fails its sha256 check")
    assert "trained on" not in line and not (tmp_path / "h.json").exists()


def test_resume_and_warm_start_on_a_pack_of_another_tokenizer_are_refused(packs, tmp_path):
    snap, byte, cfg = packs / "run" / "bpe_snap", packs / "byte", packs / "c.yaml"
    resumed = run_cli(tmp_path, "train", "--config", cfg, "--data", byte, "--resume-from", snap,
                      "--until-step", "10", "--out", tmp_path / "r", "--no-track", *BPE,
                      "model.vocab_size=300")  # the config matches the snapshot's: only --data
    assert_one_line_error(resumed, "resume:", f"snapshot {snap} was trained on the bpe",
                          f"the pack {byte} holds the byte tokenizer",
                          "pass --data the pack this run was trained on")
    warm = run_cli(tmp_path, "train", "--config", cfg, "--data", byte, "--resume-from", "none",
                   "--warm-start", snap, "--until-step", "5", "--out", tmp_path / "w",
                   "--no-track", "model.vocab_size=300")
    assert_one_line_error(warm, "warm start:", f"snapshot {snap} was trained on the bpe",
                          f"the pack {byte} holds the byte tokenizer",
                          f"path: {snap / 'tokenizer.json'}")
    assert entries(tmp_path) == []  # no snapshot, no train/ logs


def test_a_tokenizer_passed_for_evaluation_must_be_the_snapshots(packs, tmp_path):
    """generate/export --tokenizer and the benchmarks' tokenizer= (one loader)."""
    snap, other = packs / "run" / "bpe_snap", packs / "byte" / "tokenizer.json"
    for command in (["generate", "--prompt", "text"], ["export", "--out", tmp_path / "x"]):
        result = run_cli(tmp_path, *command, "--snapshot", snap, "--tokenizer", other)
        assert_one_line_error(result, f"--tokenizer {other}:", "trained on the bpe tokenizer",
                              f"{other} holds the tokenizer (258 ids)", "leave it out")
        assert result.stdout == ""
    assert entries(tmp_path) == []


def test_the_benchmark_model_refuses_a_tokenizer_of_another_identity(packs):
    from pipeline_lib.bench.lm_wrapper import LooplineLM
    from pipeline_lib.errors import DataError

    other = packs / "byte" / "tokenizer.json"
    with pytest.raises(DataError, match=r"tokenizer=.*trained on the bpe tokenizer"):
        LooplineLM.create_from_arg_string(
            f"snapshot={packs / 'run' / 'bpe_snap'},tokenizer={other},device=cpu")


def test_a_snapshot_without_a_recorded_tokenizer_is_judged_by_size_as_before(packs, tmp_path):
    """Snapshots written before they carried tokenizer.json still evaluate where they did."""
    from support.export_helpers import random_model, write_model_snapshot

    old = write_model_snapshot(tmp_path / "old", random_model("gqa"), None, with_tokenizer=False)
    result = run_cli(tmp_path, "heff", "--snapshot", old, "--data", packs / "byte", "--out",
                     tmp_path / "h.json", "--no-track")
    assert_ok(result)  # 258 ids in 258 rows, no identity to compare
    refused = run_cli(tmp_path, "heff", "--snapshot", old, "--data", packs / "bpe", "--out",
                      tmp_path / "g.json", "--no-track")
    assert_one_line_error(refused, f"the pack {packs / 'bpe'} has 300 token ids",
                          f"snapshot {old} has only 258")
    assert not (tmp_path / "g.json").exists()


# ---------------------------------------------------------------- the exit gate


def test_an_exit_gate_without_the_objective_that_trains_it_is_refused(packs, tmp_path):
    result = run_cli(tmp_path, "train", "--config", packs / "c.yaml", "--data", packs / "byte",
                     "--resume-from", "none", "--until-step", "5", "--out", tmp_path / "s",
                     "--no-track", "model.exit_gate=true")
    assert_one_line_error(result, "model.exit_gate = true, but train.objective = last never "
                          "trains the gate", "set train.objective=expected_exit")
    assert entries(tmp_path) == []


@pytest.mark.slow  # a Snakemake dry run (~3 s)
def test_an_exit_gate_without_its_objective_is_refused_when_the_run_is_planned(tmp_path):
    cfg = write_yaml(tmp_path / "gate.yaml", {"model": {"exit_gate": True},
                                              "train": {"objective": "answer_last"}})
    assert_one_line_error(run_snakemake(tmp_path, "--configfile", TINY, cfg),
                          "model.exit_gate = true, but train.objective = answer_last")
    assert not (tmp_path / "results").exists()


def test_gate_exits_from_a_gate_that_was_never_trained_are_refused(tmp_path):
    """A gated snapshot trained under deep_supervision (what the trainer wrote before the
    rule): its gate is at its initial weights, and the snapshot's config says so."""
    from support.export_helpers import random_model, write_model_snapshot

    from pipeline_lib.data.tokenizer import byte_level_tokenizer

    snap = write_model_snapshot(tmp_path / "gated", random_model("dense"), byte_level_tokenizer())
    result = run_cli(tmp_path, "generate", "--snapshot", snap, "--prompt", "a=1;",
                     "--adaptive", "gate:0.5", "--max-new-tokens", "2")
    assert_one_line_error(result, "criterion gate reads the learned exit gate",
                          f"snapshot {snap} was trained with train.objective = "
                          "deep_supervision, which never trains the gate",
                          "train.objective=expected_exit")
    assert result.stdout == ""
    other = run_cli(tmp_path, "generate", "--snapshot", snap, "--prompt", "a=1;",
                    "--adaptive", "kl:0.5", "--max-new-tokens", "2")
    assert_ok(other)  # the rest of the snapshot is usable


# ---------------------------------------------------------------- a run's own logs


def test_two_runs_in_one_folder_keep_their_own_logs(packs, tmp_path):
    cfg, byte, folder = packs / "c.yaml", packs / "byte", tmp_path / "runs"
    common = ["train", "--config", cfg, "--data", byte, "--no-track"]
    first, then = ["--resume-from", "none", "--until-step", "5"], ["--until-step", "10"]
    assert_ok(run_cli(tmp_path, *common, *first, "--out", folder / "a"))
    resume = ["--resume-from", folder / "a", *then, "--out", folder / "b"]
    assert_ok(run_cli(tmp_path, *common, *resume))  # the same run goes on: its log grows
    log = folder / "train" / "metrics.jsonl"
    before = log.read_bytes()
    assert [json.loads(x)["step"] for x in before.splitlines()] == list(range(1, 11))
    second = run_cli(tmp_path, *common, *first, "--out", folder / "c", "train.lr=0.01")
    assert_one_line_error(second, f"run directory {folder} holds the training logs",
                          "of another run (snapshot a, b)", "pass --run-dir")
    assert log.read_bytes() == before and not (folder / "c").exists()
    # its fix: logs of its own
    assert_ok(run_cli(tmp_path, *common, *first, "--out", folder / "c", "--run-dir",
                      folder / "c.run", "train.lr=0.01"))
    assert log.read_bytes() == before
    assert len((folder / "c.run" / "train" / "metrics.jsonl").read_text().splitlines()) == 5
    # a rerun of the first run's segment is still the first run's: it replaces its own tail
    shutil.rmtree(folder / "b")
    assert_ok(run_cli(tmp_path, *common, *resume))

    def rows(blob: bytes) -> list[tuple[int, float]]:
        return [(r["step"], r["loss"]) for r in map(json.loads, blob.splitlines())]

    assert rows(log.read_bytes()) == rows(before)
