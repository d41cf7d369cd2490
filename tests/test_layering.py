"""The pure core stays pure: `service/raft` and the listed decision modules may not import I/O,
clocks, threads, the network or global randomness (docs/design/layers.md#R4).

The layers between packages are checked by `make lint` (import-linter, docs/design/layers.md#R1)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE_PACKAGES = [
    "service/raft",
    "service/common/schema.py",
    "service/common/keys.py",
    "service/common/partition.py",
    "service/master/placement_policy.py",
    "service/master/report_processing.py",
    "service/master/rereplication.py",
    "service/rebalance",
]
FORBIDDEN_MODULES = {
    "asyncio",
    "grpc",
    "os",
    "time",
    "socket",
    "threading",
    "subprocess",
    "shutil",
    "pathlib",
    "google",
    "service.pb",
    "service.consensus",
    "service.common.clock",
}
ALLOWED_RANDOM_ATTRS = {"Random"}  # the type of the injected generator, never the global one


def _pure_files() -> list[Path]:
    out: list[Path] = []
    for pkg in PURE_PACKAGES:
        path = ROOT / pkg
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "random":
                names += [
                    f"random.{a.name}" for a in node.names if a.name not in ALLOWED_RANDOM_ATTRS
                ]
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in FORBIDDEN_MODULES):
                out.append(f"{_rel(path)}:{node.lineno} imports {name}")
            if name.startswith("random.") and name.split(".")[1] not in ALLOWED_RANDOM_ATTRS:
                out.append(f"{_rel(path)}:{node.lineno} imports {name}")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "random"
            and node.attr not in ALLOWED_RANDOM_ATTRS
        ):
            out.append(f"{_rel(path)}:{node.lineno} uses global random.{node.attr}")
    return out


@pytest.mark.parametrize("path", _pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_core_imports_no_io(path: Path) -> None:
    assert _violations(path) == []


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport random\nx = random.random()\nfrom time import monotonic\n")
    found = _violations(bad)
    assert len(found) == 3, found
