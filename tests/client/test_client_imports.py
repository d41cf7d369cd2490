"""No module of service.client imports one that imports it back, not even for type checking.

The client (`TesseraClient`) imports its helpers (write sessions, scanners, transactions); a
helper that imported the client back, even under `if TYPE_CHECKING`, would be handed the
whole client and could come to depend on any of it. Each helper names what it uses of its
client in a small Protocol of its own instead (`SessionClient`, `ScanClient`,
`TransactionClient`). Every import statement counts here, at any depth of the module.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "service.client"
ROOT = Path(__file__).resolve().parents[2] / "service" / "client"


def _imports(module: str, siblings: set[str]) -> set[str]:
    """The modules of the package that `module` imports anywhere in its source."""
    found: set[str] = set()
    for node in ast.walk(ast.parse((ROOT / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found |= {a.name for a in node.names}
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(PACKAGE + "."):
                    found.add(a.name.removeprefix(PACKAGE + ".").split(".")[0])
    return found & siblings


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` (its modules in order, the first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the path being explored, 2: explored, no cycle through it
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_the_client_imports_one_that_imports_it() -> None:
    modules = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    assert {"client", "write_session", "scanner", "transactions"} <= modules
    graph = {m: _imports(m, modules) for m in modules}
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"
