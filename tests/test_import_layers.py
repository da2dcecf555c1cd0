"""The layering of DESIGN.md § Layers holds, and no module of pipeline_lib imports itself back.

``lint-imports`` checks the contracts in pyproject.toml; the cycle test below builds the import
graph from the source with ``ast`` on its own, counting imports inside functions and the
names a package exports lazily (``_EXPORTS = {"name": "submodule"}``) as the imports they are.
Imports inside functions hide the dependency graph (issue 28): they stay few, and each one
says in a comment why it cannot sit at the top of its module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "pipeline_lib"
# issue 28: at most half of the 236 imports inside functions counted before the redesign
MAX_FUNCTION_IMPORTS = 110


def test_lint_imports_keeps_every_contract() -> None:
    # this checkout's sources first, so a shared virtual environment checks the right tree
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()",
         "--no-cache"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _modules(src: Path, package: str) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of ``package`` (a package by its __init__)."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _lazy_exports(tree: ast.Module) -> dict[str, str]:
    """``{name: submodule}`` from module-level dicts of strings (a package's lazy exports)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant):
                    out[str(key.value)] = str(value.value).lstrip(".")
    return out


def import_graph(src: Path = SRC, package: str = PACKAGE) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, from every import statement."""
    modules = _modules(src, package)
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    lazy = {name: _lazy_exports(tree) for name, tree in trees.items()}

    def resolve(base: str, name: str) -> str:
        sub = f"{base}.{name}"
        if sub in modules:
            return sub
        target = lazy.get(base, {}).get(name)
        return f"{base}.{target}" if f"{base}.{target}" in modules else base

    graph: dict[str, set[str]] = {}
    for name, tree in trees.items():
        package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                else:
                    base = node.module or ""
                edges |= {resolve(base, a.name) for a in node.names}
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle ``[a, b, …, a]`` of ``graph``, or ``[]`` when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_find_cycle_reports_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) == []


def test_graph_sees_function_level_and_lazy_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text('_EXPORTS = {"thing": "impl"}\n')
    (pkg / "sub" / "impl.py").write_text("def f():\n    from ..top import g\n")
    (pkg / "top.py").write_text("from .sub import thing\nimport pkg.sub\n\ndef g():\n    pass\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.top"] == {"pkg.sub", "pkg.sub.impl"}  # lazy export → its submodule
    assert graph["pkg.sub.impl"] == {"pkg.top"}  # an import inside a function counts
    assert find_cycle(graph) == ["pkg.sub.impl", "pkg.top", "pkg.sub.impl"]


def test_no_import_cycle_in_pipeline_lib() -> None:
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def function_imports(root: Path) -> list[tuple[str, int, bool]]:
    """``(file relative to root, line, has a comment)`` of every import statement inside a
    function under ``root``. A comment counts on the statement's lines or alone on the line
    above it (a real comment token: a ``#`` in a string is not one)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        with tokenize.open(path) as f:
            tokens = list(tokenize.generate_tokens(f.readline))
        comments = {t.start[0] for t in tokens if t.type == tokenize.COMMENT}
        alone = {t.start[0] for t in tokens if t.type == tokenize.COMMENT
                 and not t.line[: t.start[1]].strip()}
        tree = ast.parse(path.read_text())
        nodes = {n.lineno: n for fn in ast.walk(tree)
                 if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))}
        for line, node in sorted(nodes.items()):
            said = (line - 1 in alone
                    or any(n in comments for n in range(line, node.end_lineno + 1)))
            out.append((path.relative_to(root).as_posix(), line, said))
    return out


def test_function_imports_sees_each_kind_of_comment(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import os\n\n\n"
        "def f():\n"
        "    import json\n"                          # 5: none
        "    import re  # why\n"                     # 6: on its line
        "    # why\n"
        "    import csv\n"                           # 8: alone on the line above
        "    x = '#'\n"
        "    import abc\n"                           # 10: a '#' in a string is no comment
        "    from os import (  # why\n"             # 11: on its first line
        "        path,\n"
        "    )\n\n"
        "    def g():\n"
        "        from os import (\n"                # 16: inside the statement
        "            sep,  # why\n"
        "        )\n")
    assert function_imports(tmp_path) == [("m.py", 5, False), ("m.py", 6, True),
                                          ("m.py", 8, True), ("m.py", 10, False),
                                          ("m.py", 11, True), ("m.py", 16, True)]


def test_function_level_imports_stay_few() -> None:
    found = function_imports(SRC / PACKAGE)
    assert len(found) <= MAX_FUNCTION_IMPORTS, (
        f"{len(found)} imports inside functions (at most {MAX_FUNCTION_IMPORTS}): move one to "
        "the top of its module, or move the code that needs it where the import is cheap")


def test_each_function_level_import_says_why() -> None:
    missing: dict[str, list[int]] = {}
    for path, line, said in function_imports(SRC / PACKAGE):
        if not said:
            missing.setdefault(path, []).append(line)
    assert not missing, (
        "imports inside functions without a comment saying why (a light path it would load, "
        "e.g. CLI --help or the Snakefile's plan; a cycle; an optional dependency), or move "
        f"them to the top of the module: {missing}")
