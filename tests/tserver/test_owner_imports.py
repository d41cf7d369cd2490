"""The tablet server's helpers are handed the parts of it they use (tablet_server.py, "Wiring"):
no module of service/tserver but its entry point imports the server's module, and tablet copy
does not import the tablet manager it is handed (`tablet_copy.ReplicaHost`), not even for type
checking only."""

from __future__ import annotations

from pathlib import Path

import service.tserver
from tests.helpers.module_imports import imported_modules

PACKAGE = Path(service.tserver.__file__).parent
OWNER = "service.tserver.tablet_server"
MAY_IMPORT_OWNER = {"tablet_server.py", "__main__.py"}
FORBIDDEN = {"tablet_copy.py": {"service.tserver.tablet_manager"}}


def test_no_helper_imports_its_owner() -> None:
    offences = []
    for path in sorted(PACKAGE.glob("*.py")):
        forbidden = set(FORBIDDEN.get(path.name, set()))
        if path.name not in MAY_IMPORT_OWNER:
            forbidden.add(OWNER)
        for line, module in imported_modules(path, "service.tserver"):
            if module in forbidden:
                offences.append(f"{path.name}:{line} imports {module}")
    assert offences == []


def test_the_check_sees_an_import_under_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "helper.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from service.tserver.tablet_server import TabletServer\n"
        "from . import tablet_manager\n"
    )
    assert (3, OWNER) in imported_modules(source, "service.tserver")
    assert (4, "service.tserver.tablet_manager") in imported_modules(source, "service.tserver")
