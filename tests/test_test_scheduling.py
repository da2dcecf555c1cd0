"""The test files that share a pipeline-built session fixture are one xdist work unit
(tests/support/scheduling.py, read by tests/conftest.py), so a new user of the fixture cannot silently make a second worker
build it again."""

from __future__ import annotations

import ast
from pathlib import Path

from support.scheduling import SHARED_FIXTURE_UNITS

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _users(fixture: str) -> set[str]:
    found = set()
    for path in (PROJECT_ROOT / "tests").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        if any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
               and fixture in {a.arg for a in node.args.args}
               and not node.name == fixture
               for node in ast.walk(tree)):
            found.add(path.relative_to(PROJECT_ROOT).as_posix())
    return found


def test_every_user_of_a_shared_session_fixture_is_in_its_work_unit():
    for fixture in set(SHARED_FIXTURE_UNITS.values()):
        listed = {path for path, unit in SHARED_FIXTURE_UNITS.items() if unit == fixture}
        assert _users(fixture) == listed, (
            f"files using the {fixture} fixture and tests/support/scheduling.py's SHARED_FIXTURE_UNITS "
            "differ: list each user there (one worker builds the fixture once)")
