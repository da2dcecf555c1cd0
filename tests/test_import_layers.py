"""The layering of DESIGN.md § Layers holds, and no module of pipeline_lib imports itself back.

``lint-imports`` checks the contracts in pyproject.toml; the cycle test below builds the import
graph from the source with ``ast`` on its own, counting imports inside functions and the
names a package exports lazily (``_EXPORTS = {"name": "submodule"}``) as the imports they are.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = "pipeline_lib"


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
