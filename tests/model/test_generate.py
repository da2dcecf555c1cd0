"""The shared greedy decoding loop, driven by a scripted next-token function."""

from __future__ import annotations

from pipeline_lib.model.generate import greedy_decode

EOS = 0


def _counting(seen: list[tuple[list[int], list[list[int]]]]):
    """Next token = last token + 1, and 0 (EOS) after 5; records every call."""

    def next_ids(indices: list[int], rows: list[list[int]]) -> list[int]:
        seen.append((list(indices), [list(r) for r in rows]))
        return [0 if r[-1] >= 5 else r[-1] + 1 for r in rows]

    return next_ids


def test_rows_stop_on_their_own_at_eos_length_or_stop_string():
    seen: list = []
    out = greedy_decode(_counting(seen), [[3], [1], [1], [2]], [9, 2, 9, 0], eos_id=EOS,
                        context_len=2, stopped=lambda i, new: i == 2 and new[-1] == 3)
    assert out == [([4, 5], "eos"), ([2, 3], "length"), ([2, 3], "stop"), ([], "length")]
    assert seen == [([0, 1, 2], [[3], [1], [1]]),
                    ([0, 1, 2], [[3, 4], [1, 2], [1, 2]]),
                    ([0], [[4, 5]])]  # windows cut to context_len; row 3 never decoded


def test_without_eos_id_every_token_is_kept():
    out = greedy_decode(_counting([]), [[4]], [3], eos_id=None, context_len=8)
    assert out == [([5, 0, 1], "length")]
