"""No two modules of one package import each other (docs/design/layers.md#R9), directly or
through others, at module level or for type checking only (`if TYPE_CHECKING:`): a helper that
needs its owner's parts is handed them (a constructor argument, a small Protocol in the
helper's module), so the owner is read from the top down and each helper can be read, tested
and changed on its own.

Imports inside functions are checked separately: a few modules defer an import to save start-up
cost or to reach an optional dependency, which is fine across packages, but none may close a
loop inside one either."""

from __future__ import annotations

import ast
from pathlib import Path

import service
import spark_jobs

ROOTS = [Path(service.__file__).parent, Path(spark_jobs.__file__).parent]


def _module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, package: str, *, in_functions: bool = False) -> set[str]:
    """Modules imported at module level, in module-level `if`/`try` blocks (TYPE_CHECKING
    included) and class bodies: everything but function bodies (`in_functions`: those too)."""
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if in_functions:
                    visit(node.body)
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*parent, base] if base else parent)
                out.add(base)
                out.update(f"{base}.{a.name}" for a in node.names)
            for block in ("body", "orelse", "handlers", "finalbody"):
                inner = getattr(node, block, None)
                if isinstance(inner, list):
                    visit([n for n in inner if isinstance(n, ast.stmt)])

    visit(ast.parse(path.read_text(), str(path)).body)
    return out


def _graph(*, in_functions: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of its own package it imports (packages' __init__ excluded: a
    package's map imports nothing of its own)."""
    paths = {
        _module_name(p, root): p
        for root in ROOTS
        for p in root.rglob("*.py")
        if p.name != "__init__.py"
    }
    graph = {}
    for name, path in paths.items():
        package = name.rsplit(".", 1)[0]
        graph[name] = {
            m
            for m in _top_level_imports(path, package, in_functions=in_functions)
            if m in paths and m != name and m.rsplit(".", 1)[0] == package
        }
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert cycles(_graph()) == []


def test_no_import_inside_a_function_closes_a_cycle_in_the_service_either() -> None:
    """A deferred import may reach another package (start-up cost, an optional dependency),
    but none closes a loop inside one of the service's packages. spark_jobs keeps one such
    pair (docs/design/layers.md#R9): the streaming sink builds on the batch writer's classes
    in `datasource`, whose `streamWriter` loads the sink on use."""
    found = cycles(_graph(in_functions=True))
    assert [c for c in found if c[0].startswith("service.")] == []
    assert found == [["spark_jobs.datasource", "spark_jobs.stream_sink"]]


def test_the_check_finds_a_cycle_closed_for_type_checking(tmp_path: Path) -> None:
    owner = tmp_path / "owner.py"
    owner.write_text("from pkg import helper\n")
    helper = tmp_path / "helper.py"
    helper.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.owner import Owner\n"
    )
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from pkg import owner\n")
    graph = {
        f"pkg.{p.stem}": {
            m for m in _top_level_imports(p, "pkg") if m in {"pkg.owner", "pkg.helper"}
        }
        for p in (owner, helper, lazy)
    }
    assert graph["pkg.lazy"] == set()
    assert cycles(graph) == [["pkg.helper", "pkg.owner"]]
    assert _top_level_imports(lazy, "pkg", in_functions=True) >= {"pkg.owner"}
