"""The master's helpers are handed the parts of it they use (master.py, "Wiring"): no module of
service/master but its entry point imports the master's module, not even for type checking
only, so the master can import every helper without closing a cycle."""

from __future__ import annotations

from pathlib import Path

import service.master
from tests.helpers.module_imports import imported_modules

PACKAGE = Path(service.master.__file__).parent
OWNER = "service.master.master"
MAY_IMPORT_OWNER = {"master.py", "__main__.py"}


def test_no_helper_imports_the_master() -> None:
    offences = [
        f"{path.name}:{line} imports {module}"
        for path in sorted(PACKAGE.glob("*.py"))
        if path.name not in MAY_IMPORT_OWNER
        for line, module in imported_modules(path, "service.master")
        if module == OWNER
    ]
    assert offences == []


def test_the_check_sees_a_relative_import_under_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "helper.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .master import MasterServer\n"
    )
    assert (3, OWNER) in imported_modules(source, "service.master")
