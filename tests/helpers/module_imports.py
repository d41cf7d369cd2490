"""What a source module imports, read from its syntax tree (every import statement, at module
level, in a function or under `if TYPE_CHECKING`), for tests that pin which module may import
which where the layer contract (pyproject.toml, lint-imports) is too coarse."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, module) of every module `path` imports; `package` is the module's own package,
    to resolve relative imports. `from a import b` counts as importing `a` and `a.b` (b may
    be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found
