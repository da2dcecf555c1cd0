"""Procedural problems: answers are right, difficulty means what it says, seeds fix output."""

from __future__ import annotations

import random
import re

import pytest

from pipeline_lib.data.reasoning import generate_problem, generate_problems, iter_reasoning_problems
from pipeline_lib.errors import DataError
from pipeline_lib.spec.config import SourceConfig


def run_khop(prompt: str) -> tuple[str, int]:
    """Execute a k-hop program; return (printed value, hops from the queried var to a literal)."""
    body, query = prompt.rsplit(";print(", 1)
    assert query.endswith(")=")
    target = query[:-2]
    env: dict[str, str] = {}
    for stmt in body.split(";"):
        name, value = stmt.split("=")
        assert name not in env, "each variable is assigned once"
        env[name] = value
    hops, name = 0, target
    while not env[name].isdigit():
        name, hops = env[name], hops + 1
    return env[name], hops


@pytest.mark.parametrize("k", [1, 2, 5, 13])
def test_khop_answer_is_the_value_k_hops_away(k):
    rng = random.Random(k)
    for _ in range(30):
        p = generate_problem("khop", k, rng)
        value, hops = run_khop(p.prompt)
        assert p.answer == value and hops == k
        assert p.prompt.count(";") == 2 * (k + 1)  # two chains of k + 1 statements
        assert len(p.distractors) == 3 and len(set(p.distractors)) == 3
        assert p.answer not in p.distractors
        assert (p.task, p.difficulty) == ("khop", k)


def test_khop_distractor_chain_value_is_the_first_distractor():
    p = generate_problem("khop", 3, random.Random(0))
    literals = re.findall(r"[a-z]+=(\d)", p.prompt)
    assert sorted(literals) == sorted([p.answer, p.distractors[0]])


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_addition_is_correct_and_carries(k):
    rng = random.Random(100 + k)
    for _ in range(30):
        p = generate_problem("addition", k, rng)
        m = re.fullmatch(r"(\d+)\+(\d+)=", p.prompt)
        a, b = int(m[1]), int(m[2])
        assert len(m[1]) == k and len(m[2]) == k
        assert p.answer == str(a + b)
        assert any(int(x) + int(y) >= 10 for x, y in zip(m[1][::-1], m[2][::-1], strict=True))
        wrong = [int(d) for d in p.distractors]
        assert len(set(wrong)) == 3 and a + b not in wrong and min(wrong) >= 0


def test_addition_first_distractor_forgets_the_carries():
    p = generate_problem("addition", 3, random.Random(7))
    a, b = map(int, p.prompt[:-1].split("+"))
    no_carry = int("".join(str((int(x) + int(y)) % 10)
                           for x, y in zip(f"{a:03d}", f"{b:03d}", strict=True)))
    assert int(p.distractors[0]) == no_carry


@pytest.mark.parametrize("k", [1, 3, 8])
def test_parity(k):
    rng = random.Random(k)
    for _ in range(20):
        p = generate_problem("parity", k, rng)
        bits = re.fullmatch(r"parity\(([01]+)\)=", p.prompt)[1]
        assert len(bits) == k
        assert p.answer == str(bits.count("1") % 2)
        assert p.distractors == [str(1 - int(p.answer))]


def test_same_seed_same_problems_different_seed_different():
    a = generate_problems("khop", 3, 20, seed=1)
    assert a == generate_problems("khop", 3, 20, seed=1)
    assert a != generate_problems("khop", 3, 20, seed=2)
    assert a != generate_problems("khop", 4, 20, seed=1)[:20]


def test_reasoning_source_draws_tasks_and_levels_in_range():
    src = SourceConfig(type="reasoning", num_docs=300, tasks=["khop", "parity"],
                       min_difficulty=2, max_difficulty=4, seed=9)
    problems = list(iter_reasoning_problems(src))
    assert len(problems) == 300
    assert {p.task for p in problems} == {"khop", "parity"}
    assert {p.difficulty for p in problems} == {2, 3, 4}
    assert problems == list(iter_reasoning_problems(src))
    capped = SourceConfig(type="reasoning", num_docs=300, max_docs=10, seed=9)
    assert len(list(iter_reasoning_problems(capped))) == 10


def test_bad_task_or_difficulty_is_a_clear_error():
    with pytest.raises(DataError, match="unknown reasoning task 'sorting'"):
        generate_problem("sorting", 2, random.Random(0))
    with pytest.raises(DataError, match="difficulty 0"):
        generate_problem("khop", 0, random.Random(0))
