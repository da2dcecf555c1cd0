"""Loader: exact batch layout, world-size independence, exact resume, validation slice."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from pipeline_lib.data.loader import (
    DataCursor,
    PackedData,
    PackedSplit,
    advance_cursor,
    assemble_rows,
)
from pipeline_lib.data.pack import pack_corpus
from pipeline_lib.errors import ConfigError, DataError
from pipeline_lib.spec.config import DataConfig, SourceConfig
from pipeline_lib.spec.names import IGNORE_INDEX

PAD = 99


def test_assemble_rows_exact_layout():
    tokens = np.arange(100, dtype=np.uint16)
    # Row 0: pieces (10, len 3) and (50, len 4), one pad slot. Row 1: one full piece.
    split = PackedSplit(np.array([10, 50, 20]), np.array([3, 4, 8]), np.array([0, 2, 3]))
    answers = (np.array([0, 48, 60]), np.array([0, 51, 60]), np.array([0, 53, 60]))
    b = assemble_rows(tokens, split, np.array([0, 1]), 8, PAD, answers)
    assert b["input_ids"].tolist() == [[10, 11, 12, 50, 51, 52, 53], list(range(20, 27))]
    assert b["targets"].tolist() == [[11, 12, -100, 51, 52, 53, -100], list(range(21, 28))]
    assert b["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3], list(range(7))]
    assert b["doc_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 1], [0] * 7]
    # Answer tokens 51 and 52 (absolute 51..52) are the targets at columns 3 and 4.
    assert b["answer_mask"].tolist() == [[False] * 3 + [True, True] + [False] * 2, [False] * 7]
    # Global document (row of docs.npy) of each input token, from the answers' doc starts.
    assert b["doc_index"].tolist() == [[0, 0, 0, 1, 1, 1, 1], [0] * 7]
    # Padding: its own document id, positions restarting at 0, never a target.
    c = assemble_rows(tokens, PackedSplit(np.array([5]), np.array([2]), np.array([0, 1])),
                      np.array([0]), 6, PAD, None)
    assert c["input_ids"].tolist() == [[5, 6, PAD, PAD, PAD]]
    assert c["targets"].tolist() == [[6, -100, -100, -100, -100]]
    assert c["doc_ids"].tolist() == [[0, 0, 1, 1, 1]]
    assert c["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    assert "doc_index" not in c  # neither doc starts nor answers: no document index
    d = assemble_rows(tokens, PackedSplit(np.array([5]), np.array([2]), np.array([0, 1])),
                      np.array([0]), 6, PAD, None, doc_start=np.array([0, 4, 9]))
    assert d["doc_index"].tolist() == [[1, 1, -1, -1, -1]]  # padding: -1


def test_assemble_rows_of_a_labelled_pack_scores_each_token_at_its_own_position():
    tokens = np.arange(100, dtype=np.uint16)
    labels = np.full(100, IGNORE_INDEX, dtype=np.int32)
    labels[[10, 12, 51, 52, 20]] = [1, 2, 3, 4, 5]  # tokens 13, 54 and 27: each doc's EOS
    split = PackedSplit(np.array([10, 50, 20]), np.array([4, 5, 8]), np.array([0, 2, 3]))
    b = assemble_rows(tokens, split, np.array([0, 1]), 10, PAD, None,
                      doc_start=np.array([10, 20, 50]), labels=labels)
    assert b["input_ids"].tolist() == [[10, 11, 12, 13, 50, 51, 52, 53, 54],
                                       list(range(20, 28)) + [PAD]]
    assert b["targets"].tolist() == [[1, -100, 2, -100, -100, 3, 4, -100, -100],
                                     [5] + [-100] * 8]
    assert b["answer_mask"].tolist() == [[t != -100 for t in row] for row in b["targets"]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 4], [*range(8), 0]]
    assert b["doc_ids"].tolist() == [[0] * 4 + [1] * 5, [0] * 8 + [1]]
    assert b["doc_index"].tolist() == [[0] * 4 + [2] * 5, [1] * 8 + [-1]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("loader") / "pack"
    cfg = DataConfig(sources=[SourceConfig(type="reasoning", num_docs=400, seed=1),
                              SourceConfig(type="stdlib", max_docs=3)],
                     seq_len=48, epochs=2, val_fraction=0.05, seed=7)
    pack_corpus(cfg, out)
    return PackedData(out)


def gather(data: PackedData, cursor: DataCursor, g: int, b: int, world: int) -> dict:
    """The whole global step as seen by all ranks: micro-batches in rank order, concatenated."""
    parts, nexts = [], set()
    for rank in range(world):
        micro, nxt = data.batches_for_step(cursor, g, b, world, rank)
        assert all(m["input_ids"].shape == (b, data.seq_len) for m in micro)
        assert len(micro) == g // (b * world)
        parts += micro
        nexts.add(nxt)
    assert len(nexts) == 1
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]} | {"next": nexts.pop()}


@pytest.mark.parametrize("start_row_from_end", [None, 5])
def test_same_rows_whatever_world_size_and_micro_split(data, start_row_from_end):
    cursor = DataCursor(0, 0 if start_row_from_end is None
                        else data.rows_per_epoch - start_row_from_end)
    ref = gather(data, cursor, 8, 8, 1)
    for world in (1, 2, 4):
        for micro in (1, 2, 8 // world):
            got = gather(data, cursor, 8, micro, world)
            for key in ("input_ids", "targets", "position_ids", "doc_ids", "answer_mask",
                        "doc_index"):
                assert torch.equal(got[key], ref[key]), (world, micro, key)
    assert ref["next"] == advance_cursor(cursor, 8, data.rows_per_epoch)


def test_step_reads_the_next_rows_of_the_epoch_stream(data):
    n = data.rows_per_epoch
    cursor = DataCursor(0, n - 3)  # crosses into epoch 1
    batch = gather(data, cursor, 8, 4, 2)
    expected = np.concatenate([data.rows(0, np.arange(n - 3, n))["input_ids"],
                               data.rows(1, np.arange(0, 5))["input_ids"]])
    assert np.array_equal(batch["input_ids"].numpy(), expected)
    assert batch["next"] == DataCursor(1, 5)


def test_resume_from_a_saved_cursor_continues_exactly(data):
    g, b = 12, 3
    cursor, straight = DataCursor(), []
    for _ in range(6):
        micro, cursor = data.batches_for_step(cursor, g, b)
        straight.append(torch.cat([m["input_ids"] for m in micro]))
    cursor = DataCursor()
    for _ in range(2):
        _, cursor = data.batches_for_step(cursor, g, b)
    saved = json.loads(json.dumps(cursor.to_json()))
    resumed, cursor = [], DataCursor.from_json(saved)
    for _ in range(4):
        micro, cursor = data.batches_for_step(cursor, g, b, world_size=1, rank=0)
        resumed.append(torch.cat([m["input_ids"] for m in micro]))
    assert all(torch.equal(x, y) for x, y in zip(straight[2:], resumed, strict=True))
    assert data.advance(DataCursor(), 6, g) == cursor


def test_boundaries_positions_and_targets_on_real_rows(data):
    tokens = np.asarray(data.tokens)
    split = data.split("train/epoch_0")
    rows = data.rows(0, np.arange(40))
    for r in range(40):
        ids, tgt, pos, doc = (rows[k][r] for k in ("input_ids", "targets", "position_ids",
                                                   "doc_ids"))
        first, last = split.row_ptr[r], split.row_ptr[r + 1]
        col = 0
        for p, (s, n) in enumerate(zip(split.piece_start[first:last], split.piece_len[first:last],
                                       strict=True)):
            seg = slice(col, min(col + n, data.seq_len))
            k = seg.stop - seg.start
            assert (ids[seg] == tokens[s:s + k]).all() and (doc[seg] == p).all()
            assert pos[seg].tolist() == list(range(k))
            if col + n - 1 < data.seq_len:  # the piece's last token predicts nothing
                assert tgt[col + n - 1] == IGNORE_INDEX
            inner = slice(col, col + n - 1)
            assert (tgt[inner] == tokens[s + 1:s + n][:inner.stop - inner.start]).all()
            col += n
        if col <= data.seq_len:  # padded row: nothing from the last token on is a target
            assert (tgt[col - 1:] == IGNORE_INDEX).all() and (ids[col:] == data.pad_id).all()


def test_answer_mask_marks_reasoning_answers_and_the_eos_after_them(data):
    rows = data.rows(0, np.arange(data.rows_per_epoch))
    targets, mask, index = rows["targets"], rows["answer_mask"], rows["doc_index"]
    masked = targets[mask]
    assert masked.size > 0 and (masked != IGNORE_INDEX).all()
    digit = (masked >= ord("0")) & (masked <= ord("9"))
    assert (digit | (masked == data.eos_id)).all()  # answers are digits, then the EOS
    # Every EOS target of a document with an answer is scored (a model learns to stop
    # after its answer); the EOS of a stdlib document is not.
    answer_doc = np.load(data.data_dir / "answer_spans.npy")[:, 1] > 0
    eos = targets == data.eos_id
    of_answer_doc = eos & (index >= 0) & answer_doc[np.maximum(index, 0)]
    assert of_answer_doc.sum() > 100 and (eos & ~of_answer_doc).any()
    assert np.array_equal(mask & eos, of_answer_doc)
    # ...right after the answer: the target before it (same piece) is a scored digit.
    r, c = np.nonzero(of_answer_doc)
    same_piece = (c > 0) & (rows["doc_ids"][r, c - 1] == rows["doc_ids"][r, c])
    assert same_piece.mean() > 0.9
    assert mask[r[same_piece], c[same_piece] - 1].all()


def test_stream_cycles_after_the_last_epoch_with_a_warning(data, caplog):
    with caplog.at_level(logging.WARNING, logger="pipeline_lib.data.loader"):
        late = data.rows(2, np.arange(4))
    assert np.array_equal(late["input_ids"], data.rows(0, np.arange(4))["input_ids"])
    assert "only 2 epochs are packed" in caplog.text


def test_validation_slice_is_fixed(data):
    batches = list(data.val_batches(10, 4))
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 2]
    again = list(data.val_batches(10, 5))
    assert torch.equal(torch.cat([b["targets"] for b in batches]),
                       torch.cat([b["targets"] for b in again]))
    everything = list(data.val_batches(10_000, 64))
    assert sum(b["input_ids"].shape[0] for b in everything) == data.val_rows


def test_eval_batches_are_the_validation_slice_as_a_loss_scores_it(data):
    """The trainer's validation and the H_eff sweep read the same batches: the fixed slice on
    the device, and with ``answer_only`` the answer tokens alone as targets."""
    cpu = torch.device("cpu")
    plain = list(data.val_batches(10, 4))
    for got, want in zip(data.eval_batches(10, 4, cpu), plain, strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    answers = list(data.eval_batches(10, 4, cpu, answer_only=True))
    assert len(answers) == len(plain)
    for got, want in zip(answers, plain, strict=True):
        assert torch.equal(got["input_ids"], want["input_ids"])
        keep = want["answer_mask"]
        assert torch.equal(got["targets"][keep], want["targets"][keep])
        assert bool((got["targets"][~keep] == IGNORE_INDEX).all())
    assert any(bool(b["answer_mask"].any()) for b in plain)  # the case is not vacuous


def test_cursor_and_batch_plan_errors(data):
    with pytest.raises(DataError, match="outside this pack"):
        data.batches_for_step(DataCursor(0, data.rows_per_epoch), 8, 4)
    with pytest.raises(DataError, match="not \\[epoch, row\\]"):
        DataCursor.from_json([1])
    with pytest.raises(ConfigError, match="global_batch_rows = 10 is not a multiple"):
        data.batches_for_step(DataCursor(), 10, 4, world_size=1)


def test_damaged_or_missing_pack(tmp_path):
    with pytest.raises(DataError, match="not a packed data directory"):
        PackedData(tmp_path)
    out = tmp_path / "pack"
    pack_corpus(DataConfig(sources=[SourceConfig(type="reasoning", num_docs=30)], seq_len=16,
                           val_fraction=0.0), out)
    data = PackedData(out)
    data.verify()
    with pytest.raises(DataError, match="no validation rows"):
        next(data.val_batches(4, 2))
    blob = bytearray((out / "train/epoch_0/doc_len.npy").read_bytes())
    blob[-1] ^= 1
    (out / "train/epoch_0/doc_len.npy").write_bytes(bytes(blob))
    with pytest.raises(DataError, match="does not match its sha256"):
        PackedData(out).verify()
    with open(out / "tokens.bin", "r+b") as fh:
        fh.truncate(10)
    with pytest.raises(DataError, match="tokens.bin has 10 bytes"):
        PackedData(out)


def test_doc_index_and_levels_of_every_input_token(data):
    docs = np.load(data.data_dir / "docs.npy")
    tokens = np.asarray(data.tokens)
    problems = 400  # the reasoning source comes first: documents 0..399 have levels 1..4
    assert data.doc_levels.dtype == np.int64 and data.doc_levels.shape == (len(docs),)
    assert (data.doc_levels[:problems] >= 1).all() and (data.doc_levels[problems:] == -1).all()
    for batch in [data.rows(0, np.arange(60)),
                  {k: v.numpy() for k, v in next(data.val_batches(16, 16)).items()}]:
        index, ids, pos = batch["doc_index"], batch["input_ids"], batch["position_ids"]
        assert index.dtype == np.int64
        real = ids != data.pad_id  # reasoning and stdlib text never hold the pad id
        assert (index[real] >= 0).all() and (index[~real] == -1).all()
        whole = real & (docs[np.maximum(index, 0), 1] <= data.row_len)
        # An unsplit document starts at its piece's position 0: token = doc start + position.
        assert (ids[whole] == tokens[docs[index[whole], 0] + pos[whole]]).all()
        # Answer targets belong to documents with a level (reasoning).
        assert (data.doc_levels[index[batch["answer_mask"]]] >= 1).all()


def test_a_pack_without_levels_reads_as_unknown(tmp_path):
    out = tmp_path / "pack"
    pack_corpus(DataConfig(sources=[SourceConfig(type="reasoning", num_docs=30)], seq_len=16,
                           val_fraction=0.1), out)
    assert (PackedData(out).doc_levels >= 1).all()
    meta = json.loads((out / "metadata.json").read_text())
    del meta["arrays"]["levels.npy"]
    del meta["metadata_sha256"]  # written before either existed
    (out / "metadata.json").write_text(json.dumps(meta))
    (out / "levels.npy").unlink()
    old = PackedData(out)
    old.verify()
    assert old.doc_levels.tolist() == [-1] * meta["num_docs"]
    assert "doc_index" in old.rows(0, np.arange(2))


def test_a_pack_that_predates_train_levels_reads_as_none_trained(tmp_path):
    # Only labelled packs use train_levels, and those always record it.
    out = tmp_path / "pack"
    pack_corpus(DataConfig(sources=[SourceConfig(type="reasoning", num_docs=40, seed=2)],
                           seq_len=16, val_fraction=0.1), out)
    assert PackedData(out).train_levels == [1, 2, 3, 4] and not PackedData(out).labelled
    meta = json.loads((out / "metadata.json").read_text())
    for key in ("train_levels", "labelled", "label_dtype", "heldout_docs", "metadata_sha256"):
        del meta[key]
    (out / "metadata.json").write_text(json.dumps(meta))
    assert PackedData(out).train_levels == [] and not PackedData(out).labelled
