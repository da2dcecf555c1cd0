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
"""

from __future__ import annotations

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
        need = int(counts[s])
        rooms = np.flatnonzero(room_count[s:row_len]) + s  # rooms that fit s, ascending
        if rooms.size:
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
    # Group by row, BFD order within a row. Unique keys make any sort give the same
    # result (a stable argsort of 64-bit keys is several times slower).
    key = rows * n + np.arange(n, dtype=np.int64)
    key.sort()
    pick = shuffle[order[key % n]]
    row_ptr = np.zeros(num_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=num_rows), out=row_ptr[1:])
    return PackedRows(piece_start[pick], piece_len[pick], row_ptr)


def fill_ratio(packed: PackedRows, row_len: int) -> float:
    """Share of row slots that hold tokens (1.0 = no padding)."""
    if packed.num_rows == 0:
        return 0.0
    return float(packed.piece_len.sum()) / (packed.num_rows * row_len)
