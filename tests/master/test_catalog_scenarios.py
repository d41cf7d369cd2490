"""The data-driven catalog scenarios (tests/master/testdata/*.txt, format and commands in
tests/master/scenarios.py), one test per file.

`TESSERA_REWRITE=1 python -m pytest -q tests/master/test_catalog_scenarios.py` rewrites the
files' expected outputs instead of comparing them; review the diff before committing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.master.scenarios import CatalogEnv
from tests.raft.scenarios import check_file, rewrite_requested

TESTDATA = Path(__file__).resolve().parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_there_are_catalog_scenario_files() -> None:
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_catalog_scenario(path: Path) -> None:
    env = CatalogEnv()
    try:
        check_file(
            path, env, rewrite=rewrite_requested(), label=f"tests/master/testdata/{path.name}"
        )
    finally:
        env.close()
