"""Seeded procedural multi-step problems: the ``reasoning`` source and the built-in benchmarks.

Each problem needs a known number ``k`` of sequential steps (its difficulty), which is what
makes test-time depth measurable:

- ``khop``: a chain of k copy assignments from a literal, interleaved with a distractor
  chain of the same length, e.g. ``a=7;x=2;b=a;y=x;c=b;print(c)=`` → ``7`` (k = 2).
- ``addition``: two k-digit numbers with at least one carry, ``4821+3907=`` → ``8728``.
- ``parity``: the parity of k bits, ``parity(1011)=`` → ``1`` (k sequential XORs).

Training documents and benchmark sets call the same :func:`generate_problem` with
disjoint seeds. Everything is drawn from the ``random.Random`` passed in, so a seed fixes
the output (bump ``identity.REASONING_GENERATOR_VERSION`` whenever it changes).
"""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import DataError
from ..spec.config import SourceConfig
from ..spec.names import REASONING_TASKS

NUM_DISTRACTORS = 3


@dataclass(frozen=True)
class Problem:
    """A prompt, its answer (the document is prompt + answer), and plausible wrong answers."""

    prompt: str
    answer: str
    distractors: list[str] = field(default_factory=list)
    task: str = ""
    difficulty: int = 0


def _variable_names(count: int) -> list[str]:
    letters = list(string.ascii_lowercase)
    if count <= len(letters):
        return letters
    pairs = ["".join(p) for p in itertools.product(string.ascii_lowercase, repeat=2)]
    return letters + pairs


def _khop(k: int, rng: random.Random) -> Problem:
    names = rng.sample(_variable_names(2 * (k + 1)), 2 * (k + 1))
    values = rng.sample(range(10), 2)
    chains = []
    for c in range(2):
        chain_names = names[c * (k + 1):(c + 1) * (k + 1)]
        stmts = [f"{chain_names[0]}={values[c]}"]
        stmts += [f"{chain_names[i]}={chain_names[i - 1]}" for i in range(1, k + 1)]
        chains.append((chain_names[-1], stmts))
    # Random merge that keeps each chain in order: which slots belong to chain 0.
    slots0 = set(rng.sample(range(2 * (k + 1)), k + 1))
    it0, it1 = iter(chains[0][1]), iter(chains[1][1])
    program = [next(it0) if i in slots0 else next(it1) for i in range(2 * (k + 1))]
    target = rng.randrange(2)
    prompt = ";".join(program) + f";print({chains[target][0]})="
    others = [d for d in range(10) if d not in values]
    wrong = [values[1 - target], *rng.sample(others, NUM_DISTRACTORS - 1)]
    return Problem(prompt, str(values[target]), [str(w) for w in wrong])


def _has_carry(a: int, b: int) -> bool:
    while a or b:
        if a % 10 + b % 10 >= 10:
            return True
        a, b = a // 10, b // 10
    return False


def _sum_without_carries(a: int, b: int) -> int:
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def _addition(k: int, rng: random.Random) -> Problem:
    lo, hi = (0 if k == 1 else 10 ** (k - 1)), 10**k - 1
    while True:  # at least one carry; about half of all random pairs already have one
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        if _has_carry(a, b):
            break
    answer = a + b
    candidates = [_sum_without_carries(a, b)]
    candidates += [answer + s * 10**j for j in range(k + 1) for s in (1, -1)]
    wrong: list[int] = []
    for c in candidates:
        if c >= 0 and c != answer and c not in wrong:
            wrong.append(c)
    first, rest = wrong[0], wrong[1:]  # keep the no-carry slip, sample the rest
    picked = [first, *rng.sample(rest, NUM_DISTRACTORS - 1)]
    return Problem(f"{a}+{b}=", str(answer), [str(w) for w in picked])


def _parity(k: int, rng: random.Random) -> Problem:
    bits = [rng.randrange(2) for _ in range(k)]
    answer = sum(bits) % 2
    return Problem(f"parity({''.join(map(str, bits))})=", str(answer), [str(1 - answer)])


_GENERATORS = {"khop": _khop, "addition": _addition, "parity": _parity}


def generate_problem(task: str, difficulty: int, rng: random.Random) -> Problem:
    """One problem of ``task`` needing ``difficulty`` sequential steps, drawn from ``rng``."""
    if task not in _GENERATORS:
        raise DataError(f"unknown reasoning task {task!r}; use one of {list(REASONING_TASKS)}")
    if difficulty < 1:
        raise DataError(f"reasoning difficulty {difficulty} for task {task!r} must be >= 1")
    p = _GENERATORS[task](difficulty, rng)
    return Problem(p.prompt, p.answer, p.distractors, task, difficulty)


def generate_problems(task: str, difficulty: int, count: int, seed: int) -> list[Problem]:
    """``count`` problems of one task and level; each (task, level, seed) is its own stream."""
    rng = random.Random(f"loopline-problems:{task}:{difficulty}:{seed}")
    return [generate_problem(task, difficulty, rng) for _ in range(count)]


def iter_reasoning_problems(src: SourceConfig) -> Iterator[Problem]:
    """The documents of a ``reasoning`` source: task and difficulty drawn per document."""
    rng = random.Random(f"loopline-reasoning:{src.seed}")
    count = min(src.num_docs, src.max_docs) if src.max_docs else src.num_docs
    for _ in range(count):
        task = rng.choice(list(src.tasks))
        difficulty = rng.randint(src.min_difficulty, src.max_difficulty)
        yield generate_problem(task, difficulty, rng)
