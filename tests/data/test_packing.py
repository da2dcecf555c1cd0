"""Splitting and best-fit-decreasing packing: exact against a reference, dense, seeded."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline_lib.data.packing import (
    best_fit_decreasing,
    curriculum_order,
    fill_ratio,
    pack_documents,
    pack_documents_by_level,
    split_documents,
)


def reference_bfd(lengths: list[int], row_len: int) -> list[int]:
    """Piece-by-piece BFD (the textbook loop); returns the sorted remaining room of every row."""
    rooms: list[int] = []
    for s in sorted(lengths, reverse=True):
        fits = [i for i, r in enumerate(rooms) if r >= s]
        if fits:
            best = min(fits, key=lambda i: rooms[i])
            rooms[best] -= s
        else:
            rooms.append(row_len - s)
    return sorted(rooms)


def lognormal_lengths(n: int, median: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, np.round(rng.lognormal(np.log(median), 1.0, n))).astype(np.int64)


def test_split_only_documents_longer_than_a_row():
    starts, lens = np.array([0, 5, 17, 20]), np.array([5, 12, 3, 10])
    piece_start, piece_len = split_documents(starts, lens, row_len=5)
    # Whole documents first (in order), then the pieces of the long ones.
    assert piece_start.tolist() == [0, 17, 5, 10, 15, 20, 25]
    assert piece_len.tolist() == [5, 3, 5, 5, 2, 5, 5]


def test_split_covers_every_token_once():
    lens = lognormal_lengths(2000, 40, seed=0)
    starts = np.cumsum(lens) - lens
    piece_start, piece_len = split_documents(starts, lens, row_len=33)
    assert piece_len.max() <= 33 and piece_len.min() >= 1
    covered = np.zeros(int(lens.sum()), dtype=np.int64)
    for s, n in zip(piece_start.tolist(), piece_len.tolist(), strict=True):
        covered[s:s + n] += 1
    assert (covered == 1).all()
    assert len(piece_len) == int((-(-lens // 33)).sum())


def test_bfd_known_example():
    # 6 → new row 0; 5 → new row 1; 4 fills row 0 exactly; 3 and 2 fill row 1; 1 opens row 2.
    rows = best_fit_decreasing(np.array([6, 5, 4, 3, 2, 1]), row_len=10)
    assert rows.tolist() == [0, 1, 0, 1, 1, 2]


def test_bfd_prefers_the_tightest_row():
    # Rows with room 4 (after 6) and 3 (after 7): the 3 goes to the room-3 row.
    rows = best_fit_decreasing(np.array([7, 6, 3]), row_len=10)
    assert rows.tolist() == [0, 1, 0]


@pytest.mark.parametrize("seed", range(40))
def test_bfd_matches_reference(seed):
    rng = np.random.default_rng(seed)
    row_len = int(rng.integers(2, 60))
    lengths = rng.integers(1, row_len + 1, int(rng.integers(1, 300)))
    if seed % 2:  # many small pieces, the case that exercises multi-piece rooms
        lengths = np.minimum(lengths, max(1, row_len // 5))
    rows = best_fit_decreasing(lengths, row_len)
    used = np.bincount(rows, weights=lengths).astype(np.int64)
    assert used.max() <= row_len
    assert (used > 0).all()  # row ids are dense
    assert sorted((row_len - used).tolist()) == reference_bfd(lengths.tolist(), row_len)


def test_fill_ratio_on_100k_lognormal_lengths():
    lens = lognormal_lengths(100_000, 120, seed=1)
    packed = pack_documents(np.cumsum(lens) - lens, lens, 513, np.random.default_rng(0))
    assert fill_ratio(packed, 513) >= 0.999
    assert packed.piece_len.sum() == lens.sum()
    per_row = np.add.reduceat(packed.piece_len, packed.row_ptr[:-1])
    assert per_row.max() <= 513


def test_pack_documents_places_every_piece_once_in_valid_rows():
    lens = lognormal_lengths(3000, 30, seed=2)
    starts = np.cumsum(lens) - lens
    packed = pack_documents(starts, lens, 65, np.random.default_rng(4))
    assert packed.row_ptr[0] == 0 and packed.row_ptr[-1] == len(packed.piece_len)
    assert (np.diff(packed.row_ptr) >= 1).all()
    covered = np.zeros(int(lens.sum()), dtype=np.int64)
    for s, n in zip(packed.piece_start.tolist(), packed.piece_len.tolist(), strict=True):
        covered[s:s + n] += 1
    assert (covered == 1).all()
    per_row = np.add.reduceat(packed.piece_len, packed.row_ptr[:-1])
    assert per_row.max() <= 65
    # Within a row pieces come in placement order: longest first.
    for r in range(0, packed.num_rows, 97):
        seg = packed.piece_len[packed.row_ptr[r]:packed.row_ptr[r + 1]]
        assert (np.diff(seg) <= 0).all()


def test_pack_documents_is_seeded():
    lens = lognormal_lengths(5000, 30, seed=3)
    starts = np.cumsum(lens) - lens
    a = pack_documents(starts, lens, 65, np.random.default_rng(1))
    b = pack_documents(starts, lens, 65, np.random.default_rng(1))
    c = pack_documents(starts, lens, 65, np.random.default_rng(2))
    for x, y in [(a.piece_start, b.piece_start), (a.row_ptr, b.row_ptr)]:
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.piece_start, c.piece_start)
    # Another seed only breaks ties differently: same rows count and fill, same pieces.
    assert a.num_rows == c.num_rows
    np.testing.assert_array_equal(np.sort(a.piece_start), np.sort(c.piece_start))


def test_empty_input():
    packed = pack_documents(np.zeros(0, np.int64), np.zeros(0, np.int64), 9,
                            np.random.default_rng(0))
    assert packed.num_rows == 0 and packed.row_ptr.tolist() == [0]
    assert fill_ratio(packed, 9) == 0.0


# ---------------------------------------------------------------- levels and curriculum


def test_curriculum_order_releases_levels_on_schedule():
    # 100 rows: 40 of level 1, 30 of level 2, 30 of level 4, ramp over the first half.
    levels = np.array([1] * 40 + [2] * 30 + [4] * 30)
    rng = np.random.default_rng(0)
    order = curriculum_order(levels, 0.5, rng)
    assert sorted(order.tolist()) == list(range(100))  # a permutation: every row once
    placed = levels[order]
    # F = 50, lo = 1, hi = 4: level 2 from row ceil(50·1/3) = 17, level 4 from row 50.
    assert set(placed[:17].tolist()) == {1}
    assert placed[:50].max() == 2 and placed[50:].max() == 4
    allowed = 1 + (3 * np.arange(50)) // 50  # lo + floor((hi − lo)·p / F)
    assert (placed[:50] <= allowed).all()
    assert np.argmax(placed == 2) >= 17 and np.argmax(placed == 4) >= 50
    # Earlier levels stay mixed in after a release (drawn from the whole pool).
    assert (placed[17:50] == 1).any() and (placed[50:] == 1).any()


def test_curriculum_releases_early_when_lower_levels_run_out():
    levels = np.array([1] * 5 + [3] * 95)
    placed = levels[curriculum_order(levels, 1.0, np.random.default_rng(1))]
    # Level 3 is due at row 100 (= F), but level 1 runs out after 5 rows.
    assert placed[:5].tolist() == [1] * 5 and (placed[5:] == 3).all()


def test_curriculum_cummax_is_monotone_and_unknown_levels_come_any_time():
    rng = np.random.default_rng(3)
    levels = rng.integers(-1, 6, size=500)  # -1 = unknown, then levels 0..5
    placed = levels[curriculum_order(levels, 0.6, np.random.default_rng(4))]
    assert np.array_equal(np.sort(placed), np.sort(levels))
    known = np.where(placed >= 0, placed, 0)
    ramp = 300
    allowed = (5 * np.arange(ramp)) // ramp
    assert (known[:ramp] <= allowed).all()
    assert (placed[:20] == -1).any()  # unknown rows are released at once
    assert placed[ramp:].max() == 5


def test_curriculum_with_one_level_or_fraction_zero_is_a_permutation():
    levels = np.array([2] * 10 + [-1] * 5)
    a = curriculum_order(levels, 0.5, np.random.default_rng(5))
    b = np.random.default_rng(5).permutation(15)
    assert np.array_equal(a, b)
    two = np.array([1, 2] * 5)
    assert np.array_equal(curriculum_order(two, 0.0, np.random.default_rng(6)),
                          np.random.default_rng(6).permutation(10))


def test_pack_by_level_gives_level_homogeneous_rows_with_every_piece_once():
    rng = np.random.default_rng(7)
    lens = rng.integers(1, 30, size=300)
    starts = np.cumsum(lens) - lens
    doc_level = rng.integers(-1, 4, size=300)
    row_len = 33
    packed, row_level = pack_documents_by_level(starts, lens, doc_level, row_len,
                                                np.random.default_rng(8), 0.5)
    doc_of_piece = np.searchsorted(starts, packed.piece_start, side="right") - 1
    assert sorted(doc_of_piece.tolist()) == list(range(300))  # short documents: one piece each
    piece_row = np.repeat(np.arange(packed.num_rows), np.diff(packed.row_ptr))
    np.testing.assert_array_equal(doc_level[doc_of_piece], row_level[piece_row])
    assert np.add.reduceat(packed.piece_len, packed.row_ptr[:-1]).max() <= row_len
    # Same row count whatever the seed and whether the rows are ordered by the curriculum.
    again, _ = pack_documents_by_level(starts, lens, doc_level, row_len,
                                       np.random.default_rng(9), 0.0)
    assert again.num_rows == packed.num_rows
    known = row_level[: int(np.ceil(0.5 * packed.num_rows))]
    assert (known[known >= 0][:5] == 0).all()  # the first known rows are of the lowest level
