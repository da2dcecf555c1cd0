"""Labelled packs end to end: JSONL records → pack → batches whose targets are each input
token's own label; heldout sources in val/ only; the built-in tasks; bad records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pretrained_tokenizers import trained_bpe, write_tokenizer_json
from support.docs_example import worked_example

from pipeline_lib.data.labelled_tasks import iter_task_records
from pipeline_lib.data.loader import PackedData, assemble_rows
from pipeline_lib.data.pack import is_pack_dir, pack_corpus
from pipeline_lib.data.tokenizer import load_tokenizer
from pipeline_lib.errors import ConfigError, DataError
from pipeline_lib.spec.config import SourceConfig, TokenizerConfig
from pipeline_lib.spec.config_load import config_from_dict
from pipeline_lib.spec.names import IGNORE_INDEX

EOS = 256  # the byte tokenizer's
# A user's training file at levels 1-3 (one record without a level), and a test file at
# levels beyond them. "é" is two bytes: its label sits on the second.
TRAIN = [
    {"input": "1011|0", "labels": ["1", "0", "1", "1", None, "0"], "level": 3},
    {"input": "ab", "labels": [None, "x"], "level": 1},
    {"input": "café|1", "labels": ["c", "a", "f", "E", None, "1"], "level": 2},
    {"input_ids": [65, 66, 67], "labels": [IGNORE_INDEX, 88, 89], "level": 2},
    {"input": "zz", "labels": ["1", "0"]},
]
TEST = [
    {"input": "0110|1101", "labels": ["0", "1", "0", "0", None, "1", "0", "0", "1"],
     "level": 5},
    {"input": "111", "labels": ["1", "0", "1"], "level": 6},
]


def write_records(path: Path, records: list, blank_after_first: bool = False) -> str:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    if blank_after_first:
        lines.insert(1, "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def expected_tokens(record: dict) -> tuple[list[int], list[int]]:
    """(ids, labels) of a record under the byte tokenizer, worked out character by character."""
    if "input_ids" in record:
        return record["input_ids"], record["labels"]
    ids, labels = [], []
    for ch, label in zip(record["input"], record["labels"], strict=True):
        raw = list(ch.encode())
        ids += raw
        labels += [IGNORE_INDEX] * (len(raw) - 1) + [IGNORE_INDEX if label is None
                                                       else ord(label)]
    return ids, labels


def labelled_sources(tmp_path: Path) -> list[SourceConfig]:
    return [SourceConfig(type="labelled", path=write_records(tmp_path / "in" / "train.jsonl",
                                                             TRAIN)),
            SourceConfig(type="labelled", path=write_records(tmp_path / "in" / "test.jsonl", TEST),
                         heldout=True)]


@pytest.fixture
def labelled(tmp_path, make_data_config):
    out = tmp_path / "pack"
    meta = pack_corpus(make_data_config(labelled_sources(tmp_path), seq_len=16,
                                        val_fraction=0.0), out)
    return out, meta, PackedData(out)


def batch_documents(batch: dict) -> dict[int, tuple[list[int], list[int], list[int]]]:
    """Per document (row of docs.npy): its input ids, targets and positions in the batch."""
    out = {}
    for d in np.unique(batch["doc_index"][batch["doc_index"] >= 0]).tolist():
        at = batch["doc_index"] == d
        out[d] = (batch["input_ids"][at].tolist(), batch["targets"][at].tolist(),
                  batch["position_ids"][at].tolist())
    return out


def check_targets_are_labels(batch: dict, records: list[dict], first_doc: int) -> set[int]:
    """Every document of ``batch``: its tokens then EOS, each token's label as its target
    (the EOS, where it is an input, unlabelled); returns the documents seen."""
    seen = batch_documents(batch)
    for d, (ids, targets, positions) in seen.items():
        want_ids, want_labels = expected_tokens(records[d - first_doc])
        n = len(want_ids)
        assert ids[:n] == want_ids and ids[n:] in ([], [EOS])
        assert targets[:n] == want_labels and targets[n:] in ([], [IGNORE_INDEX])
        assert positions == list(range(len(ids)))
    pad = batch["doc_index"] < 0
    assert (batch["targets"][pad] == IGNORE_INDEX).all()
    assert (batch["targets"][batch["input_ids"] == EOS] == IGNORE_INDEX).all()
    assert np.array_equal(batch["answer_mask"], batch["targets"] != IGNORE_INDEX)
    return set(seen)


def test_targets_are_the_labels_of_the_input_tokens(labelled):
    out, meta, data = labelled
    assert data.labelled and data.has_answer_spans
    records = TRAIN + TEST
    for epoch in range(meta["num_epochs"]):
        rows = data.rows(epoch, np.arange(data.rows_per_epoch))
        assert check_targets_are_labels(rows, records, 0) == set(range(len(TRAIN)))
    val = {k: v.numpy() for k, v in data.val_batch(np.arange(data.val_rows)).items()}
    assert check_targets_are_labels(val, records, 0) == {5, 6}  # the test file, only there
    # Decoded: the labelled characters of the first record and their labels.
    tok = load_tokenizer(out)
    rows = data.rows(0, np.arange(data.rows_per_epoch))
    first = rows["doc_index"] == 0
    scored = first & rows["answer_mask"]
    assert tok.decode(rows["input_ids"][first].tolist()) == "1011|0"  # (EOS: a special)
    assert tok.decode(rows["input_ids"][scored].tolist()) == "10110"
    assert tok.decode(rows["targets"][scored].tolist()) == "10110"
    assert data.doc_levels.tolist() == [3, 1, 2, 2, -1, 5, 6]


def test_the_batch_layout_besides_targets_is_the_causal_packs(labelled):
    _, _, data = labelled
    split = data.split("train/epoch_0")
    rows = np.arange(data.rows_per_epoch)
    plain = assemble_rows(data.tokens, split, rows, data.row_len, data.pad_id, None,
                          np.load(data.data_dir / "docs.npy")[:, 0])
    labelled = data.rows(0, rows)
    assert plain.keys() == labelled.keys()
    for key in ("input_ids", "position_ids", "doc_ids", "doc_index"):
        assert np.array_equal(plain[key], labelled[key]), key


def test_metadata_of_a_labelled_pack(labelled):
    out, meta, data = labelled
    assert meta["layout"] == "document_labelled" and meta["format"] == 1
    assert meta["labelled"] is True and meta["label_dtype"] == "int32"
    assert meta["train_levels"] == [1, 2, 3] == data.train_levels
    assert (meta["heldout_docs"], meta["num_val_docs"], meta["num_train_docs"]) == (2, 2, 5)
    assert [s["heldout"] for s in meta["sources"]] == [False, True]
    assert meta["answer_docs"] == 0 and meta["split_docs"] == 0
    assert (out / "labels.bin").stat().st_size == 4 * meta["total_tokens"]
    labels = np.fromfile(out / "labels.bin", dtype=np.int32)
    docs = np.load(out / "docs.npy")
    for (start, length), record in zip(docs.tolist(), TRAIN + TEST, strict=True):
        assert labels[start:start + length].tolist() == expected_tokens(record)[1] + [-100]
    assert "labels.bin" in meta["arrays"] and is_pack_dir(out)
    data.verify()


def test_a_changed_label_is_refused(labelled):
    out, _, _ = labelled
    blob = bytearray((out / "labels.bin").read_bytes())
    blob[0] ^= 1
    (out / "labels.bin").write_bytes(bytes(blob))
    with pytest.raises(DataError, match=r"labels.bin does not match its sha256"):
        PackedData(out).verify()


def test_repack_is_byte_identical(tmp_path, make_data_config):
    data = make_data_config(labelled_sources(tmp_path), seq_len=16, val_fraction=0.0)
    a, b = pack_corpus(data, tmp_path / "a"), pack_corpus(data, tmp_path / "b")
    assert a["data_id"] == b["data_id"]
    for rel in [*a["arrays"], "tokenizer.json", "metadata.json"]:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel


def test_built_in_tasks_pack_with_their_labels(tmp_path, make_data_config):
    src = SourceConfig(type="labelled", tasks=["prefix_parity", "chain_root"], num_docs=40,
                       min_difficulty=1, max_difficulty=8, seed=3)
    test = SourceConfig(type="labelled", tasks=["chain_root"], num_docs=6, min_difficulty=12,
                        max_difficulty=12, seed=9, heldout=True)
    out = tmp_path / "pack"
    meta = pack_corpus(make_data_config([src, test], val_fraction=0.1), out)
    records = [r for _, r in iter_task_records(src)] + [r for _, r in iter_task_records(test)]
    data = PackedData(out)
    seen = check_targets_are_labels(data.rows(0, np.arange(data.rows_per_epoch)), records, 0)
    val = {k: v.numpy() for k, v in data.val_batch(np.arange(data.val_rows)).items()}
    seen_val = check_targets_are_labels(val, records, 0)
    assert seen | seen_val == set(range(46)) and not seen & seen_val
    assert set(range(40, 46)) <= seen_val and len(seen_val) == 6 + 4  # round(0.1 × 40)
    assert meta["train_levels"] == sorted({records[d]["level"] for d in seen})
    assert 12 not in meta["train_levels"] and meta["heldout_docs"] == 6
    with pytest.raises(DataError, match=r"33 tokens with the EOS/BOS exceed a row of "
                                        r"data.seq_len \+ 1 = 32; raise data.seq_len to at "
                                        r"least 32"):
        pack_corpus(make_data_config([src], seq_len=31), tmp_path / "short")


def test_token_id_records_with_a_pretrained_tokenizer(tmp_path, make_data_config):
    path = write_tokenizer_json(tmp_path / "tok" / "tokenizer.json", trained_bpe())
    tok = TokenizerConfig(type="file", path=path)
    ids = [{"input_ids": [40, 41, 42], "labels": [7, IGNORE_INDEX, 319], "level": 1}] * 4
    src = [SourceConfig(type="labelled", path=write_records(tmp_path / "ids.jsonl", ids))]
    meta = pack_corpus(make_data_config(src, tokenizer=tok), tmp_path / "pack")
    labels = np.fromfile(tmp_path / "pack" / "labels.bin", dtype=np.int32)
    assert labels.tolist() == [7, IGNORE_INDEX, 319, IGNORE_INDEX] * 4
    assert meta["eos_id"] == 2 and meta["labelled"]
    text = [SourceConfig(type="labelled", path=write_records(tmp_path / "t.jsonl", TRAIN))]
    with pytest.raises(DataError, match=r"line 1 of .*t.jsonl: a text record \('input'\) is "
                                        r"read byte by byte.*give token ids as 'input_ids'"):
        pack_corpus(make_data_config(text, tokenizer=tok), tmp_path / "results" / "p")
    assert not any((tmp_path / "results").iterdir())


def test_heldout_sources_of_a_causal_pack_are_validated_only(tmp_path, make_data_config):
    train = SourceConfig(type="reasoning", num_docs=50, max_difficulty=3, seed=1)
    hard = SourceConfig(type="reasoning", num_docs=10, min_difficulty=6, max_difficulty=7,
                        seed=2, heldout=True, weight=3.0)
    out = tmp_path / "pack"
    meta = pack_corpus(make_data_config([train, hard], val_fraction=0.1), out)
    data = PackedData(out)
    assert meta["layout"] == "document_causal_lm" and not meta["labelled"]
    assert meta["label_dtype"] is None and not data.labelled
    docs = np.load(out / "docs.npy")
    val = np.unique(data.val_batch(np.arange(data.val_rows))["doc_index"].numpy())
    assert set(range(50, 60)) <= set(val.tolist()) and len(val[val >= 0]) == 10 + 5
    starts = np.load(out / "train/epoch_0/doc_start.npy")
    trained = np.searchsorted(docs[:, 0], starts, side="right") - 1
    assert set(trained.tolist()) == set(range(50)) - set(val.tolist())
    assert meta["num_train_docs"] == 45  # weight 3 repeats no heldout document
    assert meta["train_levels"] == [1, 2, 3] == data.train_levels
    assert meta["heldout_docs"] == 10 and meta["num_val_docs"] == 15


# ---------------------------------------------------------------- bad records

GOOD = {"input": "01", "labels": ["0", "1"], "level": 1}
BAD_RECORDS = {
    "length mismatch": ({"input": "abc", "labels": ["1", "0"]},
                        "2 labels for 3 characters of 'input'; give one label"),
    "ids length mismatch": ({"input_ids": [1, 2], "labels": [3]},
                            "1 labels for 2 input_ids; give one label per id"),
    "label of two bytes": ({"input": "ab", "labels": ["10", None]},
                           r"labels\[0\] = '10' is not one byte token; use a single ASCII"),
    "label outside the vocabulary": ({"input_ids": [1, 2], "labels": [300, -100]},
                                     r"labels\[0\] = 300 is outside the vocabulary \[0, 258\); "
                                     r"use ids below 258, or -100 for no label"),
    "id outside the vocabulary": ({"input_ids": [1, -5], "labels": [3, 4]},
                                  r"input_ids\[1\] = -5 is outside the vocabulary"),
    "non-integer level": ({**GOOD, "level": 2.5}, "level 2.5 is not an integer >= 0"),
    "negative level": ({**GOOD, "level": -1}, "level -1 is not an integer >= 0"),
    "no labelled token": ({"input": "ab", "labels": [None, None]},
                          "no token has a label; label at least one or drop the record"),
    "missing labels": ({"input": "ab"}, "expected an object with 'labels' and either 'input' "
                                        "or 'input_ids'"),
    "both inputs": ({**GOOD, "input_ids": [1, 2]}, "expected an object with 'labels'"),
    "too long for a row": ({"input": "0" * 20, "labels": ["0"] * 20},
                           r"21 tokens with the EOS/BOS exceed a row of data.seq_len \+ 1 = 17; "
                           r"raise data.seq_len to at least 20"),
    "not JSON": ("{oops", "is not JSON .*; write one JSON object per line"),
}


@pytest.mark.parametrize("case", list(BAD_RECORDS))
def test_a_bad_record_is_one_line_naming_file_and_line(case, tmp_path, make_data_config):
    record, pattern = BAD_RECORDS[case]
    path = write_records(tmp_path / "in" / "bad.jsonl", [GOOD, record, GOOD],
                         blank_after_first=True)
    sources = [SourceConfig(type="labelled", path=path)]
    results = tmp_path / "results"
    with pytest.raises(DataError, match=pattern) as err:
        pack_corpus(make_data_config(sources, seq_len=16), results / "pack")
    line = str(err.value)
    assert "\n" not in line and f"line 3 of {path}" in line and "data.sources[0]" in line
    assert not results.exists() or not any(results.iterdir())


def test_labelled_and_unlabelled_sources_do_not_mix(tmp_path, make_data_config):
    sources = [SourceConfig(type="reasoning", num_docs=5), labelled_sources(tmp_path)[0]]
    with pytest.raises(ConfigError, match=r"data.sources\[1\] is labelled but data.sources\[0\] "
                                          r"\(reasoning\) is not: a pack is labelled or not"):
        pack_corpus(make_data_config(sources), tmp_path / "pack")
    with pytest.raises(ConfigError, match="tokenizer.type = bpe trains its vocabulary"):
        pack_corpus(make_data_config(labelled_sources(tmp_path),
                                     tokenizer=TokenizerConfig(type="bpe")), tmp_path / "pack")
    assert not (tmp_path / "pack").exists()


def test_the_worked_example_of_docs_data_md_packs_as_shown(tmp_path):
    """docs/data.md's two JSONL files (running parity, checked here) and their config."""
    data, files = worked_example(tmp_path)
    for records in files:
        for record in records:
            run, want = 0, []
            for ch in record["input"]:
                run = 0 if ch == "|" else run ^ int(ch)
                want.append(None if ch == "|" else str(run))
            assert record["labels"] == want, record
    meta = pack_corpus(config_from_dict({"data": data}).data, tmp_path / "pack")
    assert meta["train_levels"] == [1, 2, 3] and meta["heldout_docs"] == 2
    assert meta["num_val_docs"] == 2 and meta["num_train_docs"] == 3
