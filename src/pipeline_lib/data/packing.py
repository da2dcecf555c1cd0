"""Packing documents into rows of ``row_len = seq_len + 1`` tokens.

Documents longer than a row are first split into row-sized pieces (the last piece holds
the remainder); every piece is then placed by best-fit-decreasing (BFD): pieces in
decreasing length, each into the open row with the least room that still fits it, a new
row when none does.

BFD is computed by length class rather than piece by piece, which is what makes it fast
(a million pieces in about the time of a few ``argsort`` calls). Lengths are small
integers (≤ row_len), and all pieces of one length ``s`` are placed consecutively. The
tightest row with room ≥ s has room c; after taking a piece it has room c − s, which is
now the tightest if still ≥ s, so that row keeps taking pieces until its room is c mod s.
Placing the n pieces of class s is therefore: walk the rooms c ≥ s in increasing order,
each row there absorbing ⌊c/s⌋ pieces, until n are placed; then open new rows that take
⌊row_len/s⌋ each. Rows are kept in buckets by remaining room, as lists of id arrays, so
a class costs O(number of distinct rooms touched), not O(pieces).

For the difficulty curriculum, :func:`pack_documents_by_level` packs each document level
separately (level-homogeneous rows) and :func:`curriculum_order` orders those rows so that
the largest level allowed rises over a fraction of the epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PackedRows:
    """Pieces grouped by row: row r holds pieces ``row_ptr[r]:row_ptr[r+1]``."""

    piece_start: np.ndarray  # int64 [pieces]: offset of the piece in tokens.bin
    piece_len: np.ndarray  # int64 [pieces]: tokens in the piece (≤ row_len)
    row_ptr: np.ndarray  # int64 [rows + 1]

    @property
    def num_rows(self) -> int:
        return len(self.row_ptr) - 1


def split_documents(doc_start: np.ndarray, doc_len: np.ndarray,
                    row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Split documents longer than ``row_len`` into row-sized pieces (others stay whole).

    Returns (piece_start, piece_len), int64: first the documents that fit, in order, then
    the pieces of the long ones (the pieces of one document consecutive and in order).
    """
    doc_start = np.asarray(doc_start, dtype=np.int64)
    doc_len = np.asarray(doc_len, dtype=np.int64)
    assert doc_len.size == 0 or doc_len.min() >= 1, "documents hold at least their EOS"
    long = np.flatnonzero(doc_len > row_len)
    if long.size == 0:
        return doc_start.copy(), doc_len.copy()
    whole = np.flatnonzero(doc_len <= row_len)
    long_len = doc_len[long]
    num_pieces = -(-long_len // row_len)  # ceil
    first = np.cumsum(num_pieces) - num_pieces
    piece_doc = np.repeat(long, num_pieces)
    offset = (np.arange(int(num_pieces.sum())) - np.repeat(first, num_pieces)) * row_len
    piece_start = np.concatenate([doc_start[whole], doc_start[piece_doc] + offset])
    piece_len = np.concatenate([doc_len[whole], np.minimum(row_len, doc_len[piece_doc] - offset)])
    return piece_start, piece_len


def best_fit_decreasing(lengths: np.ndarray, row_len: int) -> np.ndarray:
    """Row id (in order of opening) of every piece, placed by best-fit-decreasing.

    ``lengths`` are integers in [1, row_len]; ties between equal lengths go in input order.
    """
    order, row_of_sorted = _bfd_sorted(np.asarray(lengths, dtype=np.int64), row_len)
    row_of_piece = np.empty_like(row_of_sorted)
    row_of_piece[order] = row_of_sorted
    return row_of_piece


def _bfd_sorted(lengths: np.ndarray, row_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, row_of_sorted): pieces in BFD order and the row each of them goes to."""
    if lengths.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    assert lengths.min() >= 1 and lengths.max() <= row_len, "pieces must fit in a row"
    key_type = np.uint16 if row_len < 1 << 16 else np.uint32
    # Stable sort by decreasing length: a radix sort for 16-bit keys.
    order = np.argsort((row_len - lengths).astype(key_type), kind="stable")
    counts = np.bincount(lengths, minlength=row_len + 1)

    room_count = np.zeros(row_len + 1, dtype=np.int64)  # open rows by remaining room
    room_rows: list[list[np.ndarray]] = [[] for _ in range(row_len + 1)]
    placed_rows: list[np.ndarray] = []  # row-id arrays, concatenated in sorted-piece order…
    placed_reps: list[int] = []  # …each id repeated this many times (pieces per row)
    next_row = 0

    def place(rows: np.ndarray, per_row: int, room_after: int) -> None:
        placed_rows.append(rows)
        placed_reps.append(per_row)
        if room_after:
            room_rows[room_after].append(rows)
            room_count[room_after] += len(rows)

    for s in np.flatnonzero(counts)[::-1].tolist():
        need = _fill_open_rows(s, int(counts[s]), row_len, room_count, room_rows, place)
        if need:  # no open row fits: open new ones
            q = row_len // s
            full, rest = divmod(need, q)
            new = np.arange(next_row, next_row + full + (rest > 0), dtype=np.int64)
            next_row += len(new)
            place(new[:full], q, row_len - q * s)
            if rest:
                place(new[full:], rest, row_len - rest * s)

    sizes = np.fromiter(map(len, placed_rows), dtype=np.int64, count=len(placed_rows))
    reps = np.repeat(np.asarray(placed_reps, dtype=np.int64), sizes)
    row_of_sorted = np.repeat(np.concatenate(placed_rows), reps)
    assert len(row_of_sorted) == len(lengths)
    return order, row_of_sorted


def _fill_open_rows(s: int, need: int, row_len: int, room_count: np.ndarray,
                    room_rows: list[list[np.ndarray]],
                    place: Callable[[np.ndarray, int, int], None]) -> int:
    """Best fit of ``need`` pieces of length ``s`` into the open rows, tightest room first
    (as many per row as fit); returns how many pieces found no open row."""
    rooms = np.flatnonzero(room_count[s:row_len]) + s  # rooms that fit s, ascending
    if not rooms.size:
        return need
    per_row = rooms // s
    cum = np.cumsum(room_count[rooms] * per_row)
    drained = int(np.searchsorted(cum, need))  # rooms[:drained] are used up entirely
    for c, q in zip(rooms[:drained].tolist(), per_row[:drained].tolist(), strict=True):
        for rows in room_rows[c]:
            place(rows, q, c % s)
        room_rows[c] = []
        room_count[c] = 0
    need -= int(cum[drained - 1]) if drained else 0
    if drained < rooms.size and need:  # the last room used takes the rest
        c, q = int(rooms[drained]), int(per_row[drained])
        full, rest = divmod(need, q)
        bucket = np.concatenate(room_rows[c])
        used = full + (rest > 0)
        room_rows[c] = [bucket[used:]] if used < len(bucket) else []
        room_count[c] -= used
        place(bucket[:full], q, c % s)
        if rest:
            place(bucket[full:used], rest, c - rest * s)
        need = 0
    return need


def _gather_rows(piece_start: np.ndarray, piece_len: np.ndarray, row: np.ndarray,
                 num_rows: int) -> PackedRows:
    """Pieces grouped by ``row`` (each piece's final row), in the given order within a row."""
    n = len(piece_len)
    # Unique keys make any sort give the same result (a stable argsort of 64-bit keys is
    # several times slower).
    key = row * n + np.arange(n, dtype=np.int64)
    key.sort()
    pick = key % n
    row_ptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=num_rows), out=row_ptr[1:])
    return PackedRows(piece_start[pick], piece_len[pick], row_ptr)


def pack_documents(doc_start: np.ndarray, doc_len: np.ndarray, row_len: int,
                   rng: np.random.Generator) -> PackedRows:
    """Split, shuffle ties, pack by BFD, and order the rows by a seeded permutation.

    The seeded shuffle before packing only breaks ties between equal lengths, so every
    epoch has the same number of rows and the same fill ratio but different row contents.
    Within a row, pieces stay in placement order (longest first).
    """
    piece_start, piece_len = split_documents(doc_start, doc_len, row_len)
    n = len(piece_len)
    shuffle = rng.permutation(n)
    order, row_of_sorted = _bfd_sorted(piece_len[shuffle], row_len)
    num_rows = int(row_of_sorted.max()) + 1 if n else 0
    rows = rng.permutation(num_rows)[row_of_sorted]
    pick = shuffle[order]  # pieces in BFD order
    return _gather_rows(piece_start[pick], piece_len[pick], rows, num_rows)


def pack_documents_by_level(doc_start: np.ndarray, doc_len: np.ndarray, doc_level: np.ndarray,
                            row_len: int, rng: np.random.Generator,
                            curriculum_fraction: float = 0.0) -> tuple[PackedRows, np.ndarray]:
    """Like :func:`pack_documents`, but every row holds documents of one level only.

    The documents of each level (-1 = unknown is a level of its own) are packed by BFD
    separately, so a row's level is that of all its documents and the row count is again
    the same in every epoch. The rows are then ordered by :func:`curriculum_order` when
    ``curriculum_fraction`` > 0, else by a seeded permutation. Returns the packed rows and
    the level of each row in its final order.
    """
    doc_start = np.asarray(doc_start, dtype=np.int64)
    doc_len = np.asarray(doc_len, dtype=np.int64)
    doc_level = np.asarray(doc_level, dtype=np.int64)
    starts, lens, rows, row_level = [], [], [], []
    num_rows = 0
    for level in np.unique(doc_level).tolist():  # ascending: the same order every epoch
        mine = doc_level == level
        piece_start, piece_len = split_documents(doc_start[mine], doc_len[mine], row_len)
        shuffle = rng.permutation(len(piece_len))
        order, row_of_sorted = _bfd_sorted(piece_len[shuffle], row_len)
        pick = shuffle[order]
        count = int(row_of_sorted.max()) + 1
        starts.append(piece_start[pick])
        lens.append(piece_len[pick])
        rows.append(row_of_sorted + num_rows)
        row_level.append(np.full(count, level, dtype=np.int64))
        num_rows += count
    levels = np.concatenate(row_level) if row_level else np.zeros(0, np.int64)
    if curriculum_fraction > 0:
        row_at = curriculum_order(levels, curriculum_fraction, rng)
    else:
        row_at = rng.permutation(num_rows)
    position = np.empty(num_rows, dtype=np.int64)
    position[row_at] = np.arange(num_rows, dtype=np.int64)
    if not starts:
        return _gather_rows(np.zeros(0, np.int64), np.zeros(0, np.int64),
                            np.zeros(0, np.int64), 0), levels
    packed = _gather_rows(np.concatenate(starts), np.concatenate(lens),
                          position[np.concatenate(rows)], num_rows)
    return packed, levels[row_at]


def curriculum_order(row_level: np.ndarray, fraction: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Row order (position → row) in which the largest level allowed rises over the first
    ``fraction`` of the rows.

    With known levels lo … hi (≥ 0) and F = ceil(fraction · rows), position p may hold a
    row of level at most lo + floor((hi − lo) · p / F) for p < F, any level from F on: level
    ℓ is released at position ceil(F · (ℓ − lo) / (hi − lo)). Rows of unknown level (-1)
    are allowed from the start. Between two releases the rows are drawn uniformly, in a
    seeded random order, from everything released and not yet placed (so earlier levels
    stay mixed in); when that pool runs dry before the next release, the next level is
    released early. Past F the remaining rows follow in a seeded random order. With fewer
    than two known levels this is a plain seeded permutation.
    """
    row_level = np.asarray(row_level, dtype=np.int64)
    total = len(row_level)
    known = np.unique(row_level[row_level >= 0]).tolist()
    if len(known) < 2 or fraction <= 0:
        return rng.permutation(total)
    lo, hi = known[0], known[-1]
    ramp_rows = math.ceil(fraction * total)
    pool = np.flatnonzero((row_level < 0) | (row_level == lo))
    placed: list[np.ndarray] = []
    done = 0
    for level in known[1:]:
        release = -(-ramp_rows * (level - lo) // (hi - lo))  # ceil, in integers
        take = min(max(release - done, 0), len(pool))
        draw = rng.permutation(len(pool))
        placed.append(pool[draw[:take]])
        pool = np.concatenate([pool[draw[take:]], np.flatnonzero(row_level == level)])
        done += take
    placed.append(pool[rng.permutation(len(pool))])
    return np.concatenate(placed)


def fill_ratio(packed: PackedRows, row_len: int) -> float:
    """Share of row slots that hold tokens (1.0 = no padding)."""
    if packed.num_rows == 0:
        return 0.0
    return float(packed.piece_len.sum()) / (packed.num_rows * row_len)
