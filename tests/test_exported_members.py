"""The public packages export exactly what they mean to (httpx's `test_exported_members`).

A package whose `__init__.py` defines `__all__` promises those names to its users: `service.client`
to applications and Spark executors, `service.raft` to the consensus layer and the simulator.
This test pins each list, so that adding or dropping a name is a decision a reviewer sees, and
checks that every name in it can be imported from the package and that the package's namespace
holds no public name outside it (a name imported into `__init__.py` is meant to be exported).
The order is ruff's (RUF022: constants, then classes, then functions, each sorted).
"""

from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

EXPORTED: dict[str, list[str]] = {
    "service.client": [
        "ColumnPredicate",
        "MasterInfo",
        "Replica",
        "RowError",
        "ScanToken",
        "SyncClient",
        "TableHandle",
        "TableSummary",
        "TabletLocation",
        "TabletScanner",
        "TabletServerInfo",
        "TesseraClient",
        "Transaction",
        "TransactionState",
        "WriteResult",
        "WriteSession",
    ],
    "service.raft": [
        "NO_NODE",
        "ConfigChange",
        "ConfigChangeRefused",
        "ConfigChangeType",
        "Entry",
        "EntryType",
        "HardState",
        "MemoryStorage",
        "Message",
        "MessageType",
        "NodeId",
        "ProposalDropped",
        "RaftConfig",
        "RaftOptions",
        "RawNode",
        "ReadState",
        "Ready",
        "Role",
        "Snapshot",
        "SnapshotMeta",
        "SoftState",
        "Status",
        "Storage",
        "config_after",
    ],
}


def _packages_with_all() -> set[str]:
    found = set()
    for top in ("service", "spark_jobs"):
        for init in (ROOT / top).rglob("__init__.py"):
            tree = ast.parse(init.read_text())
            for node in tree.body:
                targets = node.targets if isinstance(node, ast.Assign) else []
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    found.add(".".join(init.parent.relative_to(ROOT).parts))
    return found


def test_every_package_with_all_is_pinned() -> None:
    assert _packages_with_all() == set(EXPORTED), "pin the new package's __all__ here"


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_all_is_pinned(name: str) -> None:
    package = importlib.import_module(name)
    assert package.__all__ == EXPORTED[name]
    assert len(set(package.__all__)) == len(package.__all__)


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_every_exported_name_imports(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    missing = [n for n in EXPORTED[name] if n not in namespace]
    assert not missing, f"`from {name} import *` does not give {missing}"
    package = importlib.import_module(name)
    for member in EXPORTED[name]:
        assert getattr(package, member) is namespace[member]


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_every_public_member_is_exported(name: str) -> None:
    package = importlib.import_module(name)
    public = {
        n
        for n, value in vars(package).items()
        if not n.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(package.__all__)


def test_the_client_exports_its_blocking_facade() -> None:
    from service.client import SyncClient, TesseraClient

    assert SyncClient.__module__ == "service.client.sync"
    assert TesseraClient.__module__ == "service.client.client"
