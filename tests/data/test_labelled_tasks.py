"""Built-in labelled tasks: labels recomputed by brute force, exact levels, seeds fix output."""

from __future__ import annotations

import random

import pytest

from pipeline_lib.data.labelled_tasks import (
    LENGTH,
    check_task_levels,
    generate_record,
    iter_task_records,
)
from pipeline_lib.errors import DataError
from pipeline_lib.spec.config import SourceConfig


def parity_labels(text: str) -> tuple[list[str | None], int]:
    """Each bit's parity since the last '|' by summing the run again; the longest run."""
    labels, runs, start = [], [0], 0
    for i, ch in enumerate(text):
        if ch == "|":
            labels.append(None)
            start = i + 1
            runs.append(0)
            continue
        labels.append(str(sum(int(b) for b in text[start:i + 1]) % 2))
        runs[-1] += 1
    return labels, max(runs)


def walk_roots(text: str) -> tuple[list[str], int]:
    """Each character's root by following its pointers; the most hops any character takes."""
    roots, deepest = [], 0
    for i in range(len(text)):
        j, hops = i, 0
        while text[j].isdigit():
            j, hops = j - int(text[j]), hops + 1
            assert j >= 0, "a pointer before the first character"
        roots.append(text[j])
        deepest = max(deepest, hops)
    return roots, deepest


@pytest.mark.parametrize("level", [1, 2, 3, 7, 16, 31, 32])
def test_prefix_parity_labels_and_level(level):
    rng = random.Random(level)
    for _ in range(20):
        record = generate_record("prefix_parity", level, rng)
        text = record["input"]
        assert len(text) == LENGTH and set(text) <= {"0", "1", "|"}
        assert record["level"] == level
        labels, longest = parity_labels(text)
        assert record["labels"] == labels and longest == level
        # Runs of exactly k bits between resets; only the last one may be cut by the length.
        runs = text.split("|")
        assert all(len(r) == level for r in runs[:-1]) and len(runs[-1]) <= level


def test_prefix_parity_one_run_at_full_length():
    record = generate_record("prefix_parity", LENGTH, random.Random(0))
    assert "|" not in record["input"] and None not in record["labels"]


@pytest.mark.parametrize("level", [1, 2, 3, 5, 10, 20, 30, 31])
def test_chain_root_labels_and_level(level):
    rng = random.Random(level)
    for _ in range(20):
        record = generate_record("chain_root", level, rng)
        text = record["input"]
        assert len(text) == LENGTH and set(text) <= set("abcdefgh1234")
        assert text[0] in "abcdefgh"
        roots, deepest = walk_roots(text)
        assert record["labels"] == roots and deepest == level == record["level"]


def test_chain_root_deepest_level_is_one_chain_through_every_character():
    record = generate_record("chain_root", LENGTH - 1, random.Random(3))
    assert record["input"][1:] == "1" * (LENGTH - 1)
    assert record["labels"] == [record["input"][0]] * LENGTH


@pytest.mark.parametrize(("task", "level"), [("prefix_parity", 33), ("chain_root", 32),
                                             ("chain_root", 0), ("prefix_parity", 0)])
def test_a_level_the_length_cannot_hold_is_refused(task, level):
    with pytest.raises(DataError, match=f"holds levels 1 to .* not {level}"):
        generate_record(task, level, random.Random(0))


def test_same_seed_same_records_other_seed_other_records():
    def records(seed: int) -> list:
        return list(iter_task_records(SourceConfig(type="labelled", tasks=["chain_root"],
                                                   num_docs=5, seed=seed)))

    assert records(1) == records(1) != records(2)
    a, b = random.Random(1), random.Random(1)
    assert generate_record("prefix_parity", 4, a) != generate_record("prefix_parity", 5, b)


def test_a_source_draws_tasks_and_levels_in_its_range():
    src = SourceConfig(type="labelled", tasks=["prefix_parity", "chain_root"], num_docs=200,
                       min_difficulty=2, max_difficulty=6, seed=4)
    drawn = list(iter_task_records(src))
    assert drawn == list(iter_task_records(src))  # seeded
    assert len(drawn) == 200
    assert {task for task, _ in drawn} == {"prefix_parity", "chain_root"}
    assert {r["level"] for _, r in drawn} == {2, 3, 4, 5, 6}
    for task, record in drawn:
        check = parity_labels if task == "prefix_parity" else walk_roots
        labels, level = check(record["input"])
        assert (labels, level) == (record["labels"], record["level"])
    capped = SourceConfig(type="labelled", tasks=["chain_root"], num_docs=200, max_docs=7)
    assert len(list(iter_task_records(capped))) == 7


def test_a_source_asking_for_too_deep_a_level_names_the_key():
    src = SourceConfig(type="labelled", tasks=["prefix_parity", "chain_root"], max_difficulty=32)
    with pytest.raises(DataError, match=r"data.sources\[2\].max_difficulty = 32, but labelled "
                                        r"task chain_root holds levels up to 31"):
        check_task_levels(2, src)
