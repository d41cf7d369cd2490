"""The core's internal boundaries, read from the source with `ast`:

* in service/raft, only `rawnode.py` (which wraps the core) and the package's `__init__` import
  `raft.py`; `election.py` and `reads.py` see the core through the Protocols they declare
  (`ElectionCore`, `ReadCore`), not even under TYPE_CHECKING, and call no underscore method
  or attribute of it;
* service/consensus (the asyncio shell) never imports `service.raft.raft` and never touches the
  core behind a RawNode (an attribute named `raft`): it reads state through RawNode's methods.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
RAFT = ROOT / "service" / "raft"
CONSENSUS = ROOT / "service" / "consensus"
CORE = "service.raft.raft"
MAY_IMPORT_CORE = {"raft.py", "rawnode.py", "__init__.py"}


def imports_core(tree: ast.AST, package: str) -> list[int]:
    """Lines of `tree` (a module of `package`) that import the core module, in any spelling."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        if any(n == CORE or n.startswith(CORE + ".") for n in names):
            lines.append(node.lineno)
    return lines


def private_uses(tree: ast.AST, param: str) -> list[tuple[int, str]]:
    """`param._x` in `tree`: an underscore attribute of the core passed as `param`."""
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == param
        and node.attr.startswith("_")
    ]


def raft_attributes(tree: ast.AST) -> list[int]:
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "raft"]


def _name(path: Path) -> str:
    return path.name


def parse(path: Path) -> ast.AST:
    return ast.parse(path.read_text(), filename=str(path))


def test_the_checks_catch_what_they_look_for() -> None:
    """The checks below can fail: each finds the pattern it forbids."""
    for source in [
        "from service.raft.raft import Raft",
        "import service.raft.raft",
        "from service.raft import raft, types",
        "from . import raft",
        "from .raft import Raft",
    ]:
        assert imports_core(ast.parse(source), "service.raft") == [1], source
    assert imports_core(ast.parse("from ..raft.raft import Raft"), "service.consensus") == [1]
    typing_only = "if TYPE_CHECKING:\n    from service.raft.raft import Raft\n"
    assert imports_core(ast.parse(typing_only), "service.raft") == [2]
    assert imports_core(ast.parse("from service.raft import RawNode"), "service.consensus") == []
    assert imports_core(ast.parse("from .rawnode import RawNode"), "service.raft") == []
    assert private_uses(ast.parse("r._send(r._msg(t, n))\nr.send_to(t, n)"), "r") == [
        (1, "_send"),
        (1, "_msg"),
    ]
    assert raft_attributes(ast.parse("x = self.raw.raft.lead")) == [1]


@pytest.mark.parametrize(
    "path", sorted(p for p in RAFT.glob("*.py") if p.name not in MAY_IMPORT_CORE), ids=_name
)
def test_only_rawnode_imports_the_core(path: Path) -> None:
    assert imports_core(parse(path), "service.raft") == [], f"{path.name} imports {CORE}"


@pytest.mark.parametrize("name", ["election.py", "reads.py"])
def test_election_and_reads_use_no_private_member_of_the_core(name: str) -> None:
    tree = parse(RAFT / name)
    params = {
        a.arg
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        for a in f.args.args[:1]
        if a.annotation is not None and ast.unparse(a.annotation).endswith("Core")
    }
    assert params == {"r"}  # every function takes the core as `r`, typed by its Protocol
    assert private_uses(tree, "r") == []


@pytest.mark.parametrize("path", sorted(CONSENSUS.glob("*.py")), ids=_name)
def test_the_shell_stays_behind_rawnode(path: Path) -> None:
    tree = parse(path)
    assert imports_core(tree, "service.consensus") == [], f"{path.name} imports {CORE}"
    assert raft_attributes(tree) == [], f"{path.name} reaches past RawNode (`.raft`)"
