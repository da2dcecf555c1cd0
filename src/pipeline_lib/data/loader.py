"""Deterministic, resumable batches over a packed data directory (see :mod:`.pack`).

The training data is one stream of rows: epoch 0's rows in their packed order, then
epoch 1's, …; past the last packed epoch the stream cycles through the packed epochs
again (with a warning). Global step s consumes the G rows that follow the cursor (G =
global batch in rows); rank r of W takes the r-th contiguous block of G/W of them, cut
into micro-batches of B rows. Concatenating every rank's micro-batches in rank order
therefore gives the same G rows whatever W and B are, and a run resumed from a cursor
reads exactly what an uninterrupted run would have read.

Each batch is a dict of tensors, all [B, seq_len]:
``input_ids``, ``targets`` (next token, or -100 across a document boundary and in
padding), ``position_ids`` (restarting at 0 at every document piece and at the padding),
``doc_ids`` (index of the piece within its row; the padding has its own id, one past the
last piece), the bool ``answer_mask`` (targets that are answer tokens of a reasoning
document or of a prompt/answer record, and the EOS that ends the answer, for
answer-weighted losses and answer objectives: a model trained on them learns to stop) and
the int64
``doc_index`` (the global document, i.e. the row of ``docs.npy``, of each input token;
-1 in the padding), which with :attr:`PackedData.doc_levels` breaks losses down by document
and level. The model reads only the keys it knows.

A labelled pack (layout ``document_labelled``, :attr:`PackedData.labelled`) has the same keys,
but ``targets[b, i]`` is the label of input token i from ``labels.bin`` (sequence labelling:
the readout at position i is scored against label i, not the next token), -100 where the
token has none, at BOS and EOS and in the padding; ``answer_mask`` is ``targets != -100``, so
``answer_*`` objectives score the labelled tokens. A labelled document never shares a
token with another one, so no label crosses a document.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ConfigError, DataError
from ..spec.data_id import ANSWER_SPAN_VERSION, FORMAT_VERSION, LAYOUT, LAYOUT_LABELLED
from ..spec.names import IGNORE_INDEX, MANIFEST_NAME, PACK_LABELS, PACK_METADATA, PACK_TOKENS
from .verify import check_metadata, verify_pack

log = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class DataCursor:
    """Position in the row stream: the next row to read is ``row`` of logical ``epoch``."""

    epoch: int = 0
    row: int = 0

    def to_json(self) -> list[int]:
        """``[epoch, row]``: what a checkpoint stores."""
        return [self.epoch, self.row]

    @classmethod
    def from_json(cls, value: Sequence[int]) -> DataCursor:
        """Inverse of :meth:`to_json`."""
        if (len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                       for v in value) or min(value) < 0):
            raise DataError(f"data cursor {value!r} is not [epoch, row] with non-negative "
                            "integers; the trainer state file is damaged")
        return cls(int(value[0]), int(value[1]))


def advance_cursor(cursor: DataCursor, num_rows: int, rows_per_epoch: int) -> DataCursor:
    """The cursor ``num_rows`` rows further along the stream (crossing epochs as needed)."""
    flat = cursor.row + num_rows
    return DataCursor(cursor.epoch + flat // rows_per_epoch, flat % rows_per_epoch)


@dataclass(frozen=True)
class PackedSplit:
    """One packed split (an epoch of train/, or val/), memory-mapped."""

    piece_start: np.ndarray  # int64 [pieces]
    piece_len: np.ndarray  # int64 [pieces]
    row_ptr: np.ndarray  # int64 [rows + 1]


def _scatter(shape: tuple[int, int], fill: int, r: np.ndarray, c: np.ndarray,
             values: np.ndarray) -> np.ndarray:
    """An int64 array of ``shape`` holding ``fill``, and ``values`` at rows ``r``, columns ``c``."""
    out = np.full(shape, fill, dtype=np.int64)
    out[r, c] = values
    return out


def _own_labels(labels: np.ndarray, r: np.ndarray, c: np.ndarray,
                shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """``targets`` and ``answer_mask`` of labelled rows: each input token's own label (its
    value in ``labels``, placed at ``r``, ``c`` like the tokens), not the next token."""
    label = _scatter(shape, IGNORE_INDEX, r, c, labels)
    assert (label[:, -1] == IGNORE_INDEX).all(), "a label past the last input column"
    return {"targets": label[:, :-1], "answer_mask": label[:, :-1] != IGNORE_INDEX}


def assemble_rows(tokens: np.ndarray, split: PackedSplit, rows: np.ndarray, row_len: int,
                  pad_id: int, answers: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                  doc_start: np.ndarray | None = None, labels: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """Build the batch arrays (numpy, [len(rows), row_len - 1]) of the given rows of a split.

    ``answers`` = (doc_start, answer_start, answer_end), absolute token offsets per document,
    or None when the pack has no answer spans. ``doc_start`` (int64 [docs], the first column
    of docs.npy; default: that of ``answers``) gives ``doc_index``; without either the batch
    has no ``doc_index``. ``labels`` (a labelled pack's, aligned with ``tokens``): see
    :func:`_own_labels`.
    """
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    first = np.asarray(split.row_ptr[rows])
    count = np.asarray(split.row_ptr[rows + 1]) - first  # pieces per row, ≥ 1
    row_first = np.cumsum(count) - count  # position of each row's first piece in the batch
    piece_row = np.repeat(np.arange(n), count)
    piece = np.repeat(first - row_first, count) + np.arange(int(count.sum()))
    start = np.asarray(split.piece_start[piece])
    length = np.asarray(split.piece_len[piece])
    before = np.cumsum(length) - length  # tokens of earlier pieces in the batch
    piece_off = before - before[row_first][piece_row]  # column where the piece begins
    piece_in_row = np.arange(len(piece)) - row_first[piece_row]
    used = np.bincount(piece_row, weights=length, minlength=n).astype(np.int64)
    assert used.max(initial=0) <= row_len, "a packed row is longer than seq_len + 1"

    tok_piece = np.repeat(np.arange(len(piece)), length)
    tok_in_piece = np.arange(int(length.sum())) - np.repeat(before, length)
    absolute = start[tok_piece] + tok_in_piece
    r, c = piece_row[tok_piece], piece_off[tok_piece] + tok_in_piece

    columns = np.arange(row_len)[None, :]
    ids = _scatter((n, row_len), pad_id, r, c, tokens[absolute])
    doc = np.broadcast_to(count[:, None], (n, row_len)).copy()  # padding: one past the last piece
    doc[r, c] = piece_in_row[tok_piece]
    pos = columns - used[:, None]  # padding restarts at 0 too
    pos[r, c] = tok_in_piece
    answer = np.zeros((n, row_len), dtype=bool)
    if doc_start is None and answers is not None:
        doc_start = answers[0]
    d = None if doc_start is None else np.searchsorted(doc_start, start, side="right") - 1
    if answers is not None:  # d: the document of each piece
        _, ans_start, ans_end = answers
        answer[r, c] = (absolute >= ans_start[d][tok_piece]) & (absolute < ans_end[d][tok_piece])

    is_pad = columns >= used[:, None]
    same_doc = (doc[:, 1:] == doc[:, :-1]) & ~is_pad[:, 1:]
    out = {
        "input_ids": ids[:, :-1],
        "targets": np.where(same_doc, ids[:, 1:], IGNORE_INDEX),
        "position_ids": pos[:, :-1],
        "doc_ids": doc[:, :-1],
        "answer_mask": answer[:, 1:] & same_doc,
    }
    if labels is not None:  # sequence labelling
        out |= _own_labels(labels[absolute], r, c, (n, row_len))
    if d is not None:
        out["doc_index"] = _scatter((n, row_len), -1, r, c, d[tok_piece])[:, :-1]
    return out


def _not_a_pack(path: Path) -> str:
    """Why ``path`` (given as a data pack) is none, and what to pass instead."""
    if path.is_file():
        pack = (path.parent if (path.parent / PACK_METADATA).is_file()
                else "a pack's directory (results/data/<data_id>)")
        return f"{path} is a file, not a packed data directory; pass {pack}"
    if (path / MANIFEST_NAME).is_file() or (path / "model.safetensors").is_file():
        return (f"{path} is a snapshot, not a packed data directory; pass it as --snapshot "
                "and the run's pack (results/data/<data_id>) as --data")
    return (f"{path} is not a packed data directory (no metadata.json); run `python -m "
            "pipeline_lib pack --out DIR` first")


def answer_targets_only(batch: Batch) -> Batch:
    """``batch`` with every target outside ``answer_mask`` ignored: how models trained with an
    ``answer_*`` objective are validated and swept (on the tokens they were trained on)."""
    targets = torch.where(batch["answer_mask"], batch["targets"], IGNORE_INDEX)
    return {**batch, "targets": targets}


def _to_torch(arrays: dict[str, np.ndarray]) -> Batch:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        return parts[0]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class PackedData:
    """Reader of ``results/data/{data_id}``: training stream, validation slice, cursor maths."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        meta_path = self.data_dir / PACK_METADATA
        if not meta_path.is_file():
            raise DataError(_not_a_pack(self.data_dir))
        try:
            self.metadata: dict[str, Any] = json.loads(meta_path.read_bytes())
        except ValueError as exc:  # not JSON, or not UTF-8
            raise DataError(f"{meta_path} is not valid JSON ({str(exc)[:80]}); the pack is "
                            "damaged: re-pack it") from None
        if not isinstance(self.metadata, dict):
            raise DataError(f"{meta_path} is not a JSON object; the pack is damaged: re-pack it")
        check_metadata(self.data_dir, self.metadata)
        fmt, layout = self.metadata.get("format"), self.metadata.get("layout")
        if fmt != FORMAT_VERSION or layout not in (LAYOUT, LAYOUT_LABELLED):
            raise DataError(f"{self.data_dir} has format {fmt!r}/{layout!r}, this code reads "
                            f"{FORMAT_VERSION}/{LAYOUT} or {LAYOUT_LABELLED}; re-run the pack")
        # Sequence labelling: targets are labels.bin's, aligned with the inputs.
        self.labelled: bool = layout == LAYOUT_LABELLED
        m = self.metadata
        self.seq_len: int = m["seq_len"]
        self.row_len: int = m["row_len"]
        self.rows_per_epoch: int = m["rows_per_epoch"]
        self.num_epochs: int = m["num_epochs"]
        self.val_rows: int = m["val_rows"]
        self.vocab_size: int = m["vocab_size"]
        self.eos_id: int = m["eos_id"]
        self.pad_id: int = m["pad_id"]
        # Every file against metadata.json before anything is read (cheap after the first
        # time: see pipeline_lib.data.verify).
        self.tokens = self._token_file(PACK_TOKENS, m["token_dtype"])
        self._labels = self._token_file(PACK_LABELS, m["label_dtype"]) if self.labelled else None
        self.verified = verify_pack(self.data_dir, self.metadata)
        docs = np.load(self._path("docs.npy"))
        self._doc_start = np.ascontiguousarray(docs[:, 0])
        levels_path = self.data_dir / "levels.npy"
        # Each document's level (int64 [num_docs], -1 = unknown); a pack written before
        # levels.npy existed has none.
        self.doc_levels: np.ndarray = (np.load(levels_path) if levels_path.is_file()
                                       else np.full(len(docs), -1, dtype=np.int64))
        self._answers = None
        spans_path = self.data_dir / "answer_spans.npy"
        if spans_path.is_file():
            spans = np.load(spans_path)
            if (spans[:, 1] > 0).any():
                self._check_answer_spans()
                ans_start = docs[:, 0] + spans[:, 0]
                self._answers = (docs[:, 0], ans_start, ans_start + spans[:, 1])
        self._splits: dict[str, PackedSplit] = {}
        self._warned_epochs: set[int] = set()

    def _token_file(self, rel: str, dtype: str) -> np.memmap:
        """A file of one value per token (``tokens.bin``, ``labels.bin``), memory-mapped
        after its size is checked against metadata.json."""
        path, dtype = self._path(rel), np.dtype(dtype)
        expected = self.metadata["total_tokens"] * dtype.itemsize
        if path.stat().st_size != expected:
            raise DataError(f"{path} has {path.stat().st_size} bytes, metadata says "
                            f"{expected}; the pack is damaged, re-run it")
        return np.memmap(path, dtype=dtype, mode="r")

    @property
    def train_levels(self) -> list[int]:
        """The distinct levels (>= 0) of the training documents, ascending (levels beyond
        them were never trained on); [] for a pack written before the key (none labelled)."""
        return list(self.metadata.get("train_levels", []))

    def _check_answer_spans(self) -> None:
        """Refuse answer spans of an older version: they would silently train another mask."""
        version = self.metadata.get("answer_span_version", 1)
        if version != ANSWER_SPAN_VERSION:
            raise DataError(f"{self.data_dir} records answer spans of version {version} (the "
                            "answer without the EOS after it), this code reads version "
                            f"{ANSWER_SPAN_VERSION} (answer and EOS); re-run the pack")

    @property
    def has_answer_spans(self) -> bool:
        """Whether any document carries an answer span, or the pack labels (what answer_*
        objectives score)."""
        return self._answers is not None or self.labelled

    def _path(self, rel: str) -> Path:
        path = self.data_dir / rel
        if not path.is_file():
            raise DataError(f"{path} is missing; the pack in {self.data_dir} is incomplete, "
                            "re-run it")
        return path

    def split(self, prefix: str) -> PackedSplit:
        """The memory-mapped arrays of ``train/epoch_{e}`` (a packed epoch) or ``val``."""
        if prefix not in self._splits:
            self._splits[prefix] = PackedSplit(
                *(np.load(self._path(f"{prefix}/{name}.npy"), mmap_mode="r")
                  for name in ("doc_start", "doc_len", "row_ptr")))
        return self._splits[prefix]

    def _packed_epoch(self, epoch: int) -> int:
        """The packed epoch that logical ``epoch`` reuses. Wrap-arounds are warned about
        once, then summarised at the 10th, 100th, … new one: a tiny corpus wraps at nearly
        every step and would otherwise log a line each time."""
        if epoch >= self.num_epochs and epoch not in self._warned_epochs:
            self._warned_epochs.add(epoch)
            count = len(self._warned_epochs)
            if count == 1:
                log.warning("data stream entered epoch %d but only %d epochs are packed; "
                            "reusing epoch %d (raise data.epochs or add data to avoid "
                            "repeats; further wrap-arounds are counted, not logged each)",
                            epoch, self.num_epochs, epoch % self.num_epochs)
            elif math.log10(count).is_integer():
                log.warning("data stream wrapped around past the %d packed epochs %d times so "
                            "far (now in epoch %d)", self.num_epochs, count, epoch)
        return epoch % self.num_epochs

    def rows(self, epoch: int, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Batch arrays (numpy) of ``rows`` of logical training ``epoch``."""
        split = self.split(f"train/epoch_{self._packed_epoch(epoch)}")
        return assemble_rows(self.tokens, split, rows, self.row_len, self.pad_id, self._answers,
                             self._doc_start, self._labels)

    def _check_cursor(self, cursor: DataCursor) -> None:
        if cursor.epoch < 0 or not 0 <= cursor.row < self.rows_per_epoch:
            raise DataError(f"data cursor (epoch {cursor.epoch}, row {cursor.row}) is outside "
                            f"this pack ({self.rows_per_epoch} rows per epoch); resume with the "
                            "data pack the run started with")

    def advance(self, cursor: DataCursor, steps: int, global_batch_rows: int) -> DataCursor:
        """The cursor after ``steps`` global steps (e.g. to skip data after a rollback)."""
        self._check_cursor(cursor)
        return advance_cursor(cursor, steps * global_batch_rows, self.rows_per_epoch)

    def stream_rows(self, cursor: DataCursor, count: int) -> dict[str, np.ndarray]:
        """The next ``count`` rows of the stream from ``cursor``, as numpy batch arrays."""
        self._check_cursor(cursor)
        parts = []
        while count > 0:
            take = min(count, self.rows_per_epoch - cursor.row)
            parts.append(self.rows(cursor.epoch, np.arange(cursor.row, cursor.row + take)))
            cursor = advance_cursor(cursor, take, self.rows_per_epoch)
            count -= take
        return _concat(parts)

    def batches_for_step(self, cursor: DataCursor, global_batch_rows: int, micro_batch_rows: int,
                         world_size: int = 1, rank: int = 0) -> tuple[list[Batch], DataCursor]:
        """This rank's micro-batches of the global step starting at ``cursor``, and the cursor
        of the next step. Every rank returns the same next cursor."""
        per_pass = micro_batch_rows * world_size
        if global_batch_rows % per_pass:
            raise ConfigError(f"train.global_batch_rows = {global_batch_rows} is not a multiple "
                              f"of micro_batch_rows × world size = {per_pass}; use a multiple")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        per_rank = global_batch_rows // world_size
        self._check_cursor(cursor)
        mine = self.stream_rows(advance_cursor(cursor, rank * per_rank, self.rows_per_epoch),
                                per_rank)
        micro = [_to_torch({k: v[i:i + micro_batch_rows] for k, v in mine.items()})
                 for i in range(0, per_rank, micro_batch_rows)]
        return micro, advance_cursor(cursor, global_batch_rows, self.rows_per_epoch)

    def val_batches(self, num_rows: int, batch_rows: int) -> Iterator[Batch]:
        """The first ``num_rows`` validation rows (fewer if val/ is smaller), in batches."""
        if self.val_rows == 0:
            raise DataError(f"{self.data_dir} has no validation rows; set data.val_fraction > 0"
                            " and re-run the pack")
        total = min(num_rows, self.val_rows)
        if total < num_rows:
            log.info("validation asks for %d rows, the pack has %d; using all", num_rows, total)
        for i in range(0, total, batch_rows):
            yield self.val_batch(np.arange(i, min(i + batch_rows, total)))

    def val_batch(self, rows: np.ndarray) -> Batch:
        """Validation rows ``rows`` (indices into val/, any order) as one CPU batch."""
        return _to_torch(assemble_rows(self.tokens, self.split("val"), rows, self.row_len,
                                       self.pad_id, self._answers, self._doc_start,
                                       self._labels))

    def eval_batches(self, num_rows: int, batch_rows: int, device: torch.device, *,
                     answer_only: bool = False) -> Iterator[Batch]:
        """:meth:`val_batches` as a validation loss scores them, for the trainer's validation
        and the H_eff sweep alike: on ``device``, and with ``answer_only`` (``answer_*``
        objectives) only the answer tokens as targets (:func:`answer_targets_only`)."""
        for batch in self.val_batches(num_rows, batch_rows):
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            yield answer_targets_only(batch) if answer_only else batch

    def verify(self) -> None:
        """Hash every file of the pack against metadata.json, whatever the verified-once
        marker says (reads every byte; the constructor's check trusts the marker)."""
        verify_pack(self.data_dir, self.metadata, use_marker=False)
