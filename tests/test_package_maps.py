"""Every module is on its package's map.

Each package under `service/` and `spark_jobs/` opens its `__init__.py` with a map of its
modules (docs/design/README.md): a newcomer reads it to find where something lives. This test
fails when a module is missing from its package's map, and when the map's table of modules (the
rows under "Modules") names a module that is not there.

A module counts as named when its docstring has a row that starts with the name (`    name
what it does`), or names it in backticks (`` `name` ``) or as a file (`name.py`). Generated
protobuf code (`*_pb2*`), `__init__` and `__main__` need no entry.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP_PACKAGES = ("service", "spark_jobs")

# The table under a "Modules" heading: indented rows, blank lines between groups, up to the
# first line that is not indented.
MODULES_SECTION = re.compile(r"^Modules\n-+\n((?:[ \t]+\S[^\n]*\n?|\n)*)", re.MULTILINE)
MAP_ROW = re.compile(r"^ {4}([A-Za-z_]\w*)(/|\.py)?(?:\s|$)")


def _packages() -> list[Path]:
    found: list[Path] = []
    for top in TOP_PACKAGES:
        found.extend(
            init.parent
            for init in sorted((ROOT / top).rglob("__init__.py"))
            if "__pycache__" not in init.parts
        )
    return found


def _modules(package: Path) -> list[str]:
    return sorted(
        p.stem
        for p in package.glob("*.py")
        if p.stem not in ("__init__", "__main__") and "_pb2" not in p.stem
    )


def _map(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def _named(doc: str, module: str) -> bool:
    m = re.escape(module)
    patterns = (
        rf"^\s+{m}(?:\.py)?(?:\s|$)",  # a row of the map
        rf"`{m}(?:\.py)?`",  # in backticks
        rf"(?<![\w.]){m}\.py\b",  # as a file
    )
    return any(re.search(p, doc, re.MULTILINE) for p in patterns)


def _rel(package: Path) -> str:
    return str(package.relative_to(ROOT))


@pytest.mark.parametrize("package", _packages(), ids=_rel)
def test_every_module_is_on_its_package_map(package: Path) -> None:
    doc = _map(package)
    missing = [m for m in _modules(package) if not _named(doc, m)]
    assert not missing, (
        f"{_rel(package)}/__init__.py: its docstring's map does not name {missing}; add a row "
        "saying in a few words what each does"
    )


@pytest.mark.parametrize("package", _packages(), ids=_rel)
def test_every_map_row_is_a_module(package: Path) -> None:
    section = MODULES_SECTION.search(_map(package))
    if section is None:
        return
    known = set(_modules(package)) | {"__main__"}
    subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
    stale = []
    for line in section.group(1).splitlines():
        row = MAP_ROW.match(line)
        if row is None:
            continue
        name, suffix = row.group(1), row.group(2)
        if name not in (subpackages if suffix == "/" else known | subpackages):
            stale.append(name)
    assert not stale, f"{_rel(package)}/__init__.py: the map names no such module: {stale}"


def test_the_packages_are_found() -> None:
    names = {_rel(p) for p in _packages()}
    assert {"service", "service/testing", "service/master", "spark_jobs/jobs"} <= names
