"""No test module imports another test module.

Helpers that several test modules share live in `tests/helpers/` (or in a `conftest.py` when a
fixture is their natural form). Importing a `test_*` module for its helpers runs its
module-level code and pulls its tests into the importer's namespace, and it ties one test file
to another's internals. This test parses every file under `tests/` and fails, naming the file
and line, on any import of a module `tests.<...>.test_*` (at module level or inside a function),
on `from tests.<package> import test_*`, and on a relative import of a `test_*` module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def _is_test_module(parts: list[str]) -> bool:
    return any(part.startswith("test_") for part in parts)


def _offences(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every import of a test module in `tree`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tests" and _is_test_module(parts[1:]):
                    found.append((node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = module.split(".") if module else []
            relative = node.level > 0
            if not relative and (not parts or parts[0] != "tests"):
                continue
            inside = parts if relative else parts[1:]
            names = [alias.name for alias in node.names]
            if _is_test_module(inside) or any(n.startswith("test_") for n in names):
                what = f"from {'.' * node.level}{module} import {', '.join(names)}"
                found.append((node.lineno, what))
    return found


def test_no_test_module_imports_another_test_module() -> None:
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(ROOT)
        problems.extend(f"{rel}:{line}: {what}" for line, what in _offences(tree))
    assert not problems, (
        "test modules import other test modules; move the shared helpers to tests/helpers/ "
        "(or a conftest.py fixture):\n" + "\n".join(problems)
    )


def test_the_check_sees_every_form_of_import() -> None:
    source = """
import tests.master.test_catalog_manager
import tests.master.test_catalog_manager as cm
from tests.master.test_catalog_manager import Env
from tests.master import test_catalog_manager
from .test_rowstore import Writer
from . import test_rowstore
from ..tserver.test_rowstore import Writer

def f():
    from tests.integration.test_status_pages import metrics_of

import tests.helpers.catalog_env
from tests.helpers.catalog_env import Env
from tests.spark.conftest import masters
from . import conftest
from service.master import catalog_manager
"""
    lines = [line for line, _ in _offences(ast.parse(source))]
    assert lines == [2, 3, 4, 5, 6, 7, 8, 11]
