"""The simulator's network and quiescence do not import the simulator that imports them, not
even for type checking: each names what it uses of the simulator and its nodes in a small
Protocol of its own (`NetNode`; `QuietSim`, `QuietNode`), so neither can come to depend on the
rest of it. Every import statement counts here, at any depth of the module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTING = Path(__file__).resolve().parents[2] / "service" / "testing"


def _imported(source: str) -> set[str]:
    """Every module an import statement of `source` names, at any depth."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_the_scan_sees_imports_under_type_checking_and_in_functions() -> None:
    typing_only = "if TYPE_CHECKING:\n    from service.testing.simulator import SimNode\n"
    in_function = "def f():\n    from service.testing import simulator\n"
    assert "service.testing.simulator" in _imported(typing_only)
    assert "service.testing.simulator" in _imported(in_function)
    assert "service.testing.simulator" not in _imported("from service.testing import simdisk\n")


@pytest.mark.parametrize("module", ["sim_network", "sim_quiesce"])
def test_the_helper_does_not_import_the_simulator(module: str) -> None:
    assert "service.testing.simulator" not in _imported((TESTING / f"{module}.py").read_text())
