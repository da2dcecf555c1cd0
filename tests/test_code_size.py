"""Every module of ``src/pipeline_lib`` stays readable: at most 400 lines, no function over 60.

The exact rule (issue 12's acceptance, STYLE.md's house rule 1), measured with ``ast``:

- A module's size is its number of lines (``len(text.splitlines())``), every line counted,
  with no exemption (the config's sections are split by concern, ``spec/config*.py``). A
  module may have at most 400 lines.
- A function's size is its span from the ``def`` line (decorators not counted) to its last
  line, both included: ``end_lineno - lineno + 1``. This holds for every function and method,
  async or not, nested or not (a nested function counts inside its parent's span as well).
  A function may span at most 60 lines.

The test lists every offender at once, so one run shows all that is left to split.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "pipeline_lib"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_lines(text: str) -> int:
    """Lines that count against the module limit: all of them."""
    return len(text.splitlines())


def long_functions(tree: ast.Module) -> list[tuple[str, int, int]]:
    """``(qualified name, def line, span)`` of every function spanning more than the limit."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    span = child.end_lineno - child.lineno + 1
                    if span > MAX_FUNCTION_LINES:
                        out.append((name, child.lineno, span))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def offenders() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        tree = ast.parse(text, filename=str(path))
        rel = path.relative_to(PACKAGE.parent).as_posix()
        lines = module_lines(text)
        if lines > MAX_MODULE_LINES:
            found.append(f"{rel}: {lines} lines (limit {MAX_MODULE_LINES})")
        for name, lineno, span in long_functions(tree):
            found.append(f"{rel}:{lineno} {name}: {span} lines (limit {MAX_FUNCTION_LINES})")
    return found


def test_the_rule_measures_what_it_says(tmp_path: Path) -> None:
    source = (
        "@dataclass\n"
        "class A:\n"
        '    """doc"""\n'
        "    x: int = 1\n"
        "def f():\n" + "    pass\n" * 60 +
        "class B:\n"
        "    def g(self):\n"
        "        return 1\n")
    tree = ast.parse(source)
    assert long_functions(tree) == [("f", 5, 61)]
    assert module_lines(source) == 4 + 1 + 60 + 3  # a dataclass's fields count too


def test_no_module_over_400_lines_and_no_function_over_60() -> None:
    found = offenders()
    assert not found, "split these along a natural seam:\n" + "\n".join(found)
