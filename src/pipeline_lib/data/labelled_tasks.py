"""Seeded easy-to-hard sequence-labelling tasks: the ``labelled`` source without a path.

Every record has :data:`LENGTH` input characters and a label (or none) per character, scored
at that character (no teacher forcing); its level k is the number of sequential steps the
hardest label needs:

- ``prefix_parity``: bits in runs of exactly k separated by a reset ``|`` (the last run cut
  by the length); each bit is labelled with the parity of the bits since the last reset,
  itself included (k sequential XORs at the end of a run); ``|`` has no label.
  ``0110|1`` → ``0 1 0 0 - 1`` (k = 4).
- ``chain_root``: pointer chasing; each character is a root (a letter ``a``–``h``, its own
  root) or a digit ``1``–``4`` meaning "my parent is that many characters back"; the first
  character is a root, and every character is labelled with its root's letter. k is the
  largest number of pointer hops to a root in the record: one chain has exactly k hops, no
  character more. ``c1b11`` → ``c c b b b`` (k = 2: the last ``1`` → ``1`` → ``b``).

Records have the shape of a user's text record (:mod:`.labelled`): ``input``, ``labels``
(one string or None per character) and ``level``, so built-ins and files share one path.
Everything is drawn from the ``random.Random`` passed in, so a seed fixes the output (bump
``data_id.LABELLED_GENERATOR_VERSION`` whenever it changes).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

from ..errors import DataError
from ..spec.config import SourceConfig
from ..spec.names import LABELLED_TASKS

LENGTH = 32  # input characters of every built-in record (fits data.seq_len >= 32 with its EOS)
ROOTS = "abcdefgh"  # chain_root's root symbols
MAX_POINTER = 4  # chain_root's longest pointer (digits 1-4)
ROOT_SHARE = 0.25  # chain_root: chance that a character off the deepest chain is a root

Record = dict[str, Any]


def max_level(task: str) -> int:
    """The largest level ``task`` can hold in :data:`LENGTH` characters: one run of LENGTH
    bits, or a chain through every character (LENGTH - 1 hops)."""
    return LENGTH if task == "prefix_parity" else LENGTH - 1


def _prefix_parity(k: int, rng: random.Random) -> Record:
    chars: list[str] = []
    labels: list[str | None] = []
    parity = 0
    while len(chars) < LENGTH:
        if len(chars) % (k + 1) == k:  # after every k bits, a reset
            chars.append("|")
            labels.append(None)
            parity = 0
            continue
        bit = rng.randrange(2)
        parity ^= bit
        chars.append(str(bit))
        labels.append(str(parity))
    return {"input": "".join(chars), "labels": labels}


def _chain_positions(k: int, rng: random.Random) -> list[int]:
    """k + 1 increasing positions, each within MAX_POINTER of the one before: the chain."""
    pos = [rng.randint(0, LENGTH - 1 - k)]
    for left in range(k - 1, -1, -1):  # gaps still to place after this one
        room = LENGTH - 1 - pos[-1] - left
        pos.append(pos[-1] + rng.randint(1, min(MAX_POINTER, room)))
    return pos


def _chain_root(k: int, rng: random.Random) -> Record:
    pos = _chain_positions(k, rng)
    link = dict(zip(pos[1:], pos, strict=False))  # a chain position → the one before it
    chars: list[str] = []
    depth: list[int] = []
    root: list[str] = []
    for i in range(LENGTH):
        if i in link or i == pos[0]:  # the deepest chain: a root, then k pointers
            back = i - link.get(i, i)
        else:  # off the chain: a root, or a pointer whose depth stays within k
            fits = [d for d in range(1, min(MAX_POINTER, i) + 1) if depth[i - d] < k]
            back = rng.choice(fits) if fits and rng.random() >= ROOT_SHARE else 0
        if back:
            chars.append(str(back))
            depth.append(depth[i - back] + 1)
            root.append(root[i - back])
        else:
            chars.append(rng.choice(ROOTS))
            depth.append(0)
            root.append(chars[-1])
    assert max(depth) == k, "the chain sets the level"
    return {"input": "".join(chars), "labels": root}


_GENERATORS = {"prefix_parity": _prefix_parity, "chain_root": _chain_root}


def generate_record(task: str, level: int, rng: random.Random) -> Record:
    """One record of ``task`` at ``level`` (``input``, ``labels``, ``level``), from ``rng``."""
    if task not in _GENERATORS:
        raise DataError(f"unknown labelled task {task!r}; use one of {list(LABELLED_TASKS)}")
    if not 1 <= level <= max_level(task):
        raise DataError(f"labelled task {task!r} holds levels 1 to {max_level(task)} in its "
                        f"{LENGTH} characters, not {level}; ask for a level in that range")
    return {**_GENERATORS[task](level, rng), "level": level}


def check_task_levels(index: int, src: SourceConfig) -> None:
    """Every task of ``data.sources[index]`` can hold its largest level (a DataError naming
    the key otherwise), checked before a pack starts."""
    for task in src.tasks:
        if src.max_difficulty > max_level(task):
            raise DataError(f"data.sources[{index}].max_difficulty = {src.max_difficulty}, but "
                            f"labelled task {task} holds levels up to {max_level(task)} in its "
                            f"{LENGTH} characters; lower it")


def iter_task_records(src: SourceConfig) -> Iterator[tuple[str, Record]]:
    """(task, record) of a labelled source without a path: task and level drawn per record."""
    rng = random.Random(f"loopline-labelled:{src.seed}")
    count = min(src.num_docs, src.max_docs) if src.max_docs else src.num_docs
    for _ in range(count):
        task = rng.choice(list(src.tasks))
        level = rng.randint(src.min_difficulty, src.max_difficulty)
        yield task, generate_record(task, level, rng)
