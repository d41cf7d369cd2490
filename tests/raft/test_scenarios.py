"""The data-driven Raft scenarios (tests/raft/testdata/*.txt, format in tests/raft/scenarios.py),
one test per file, and tests of the runner itself.

`TESSERA_REWRITE=1 python -m pytest -q tests/raft/test_scenarios.py` rewrites the files'
expected outputs instead of comparing them; review the diff before committing it."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.raft import EntryType
from tests.raft.scenarios import (
    REWRITE_ENV,
    RaftEnv,
    ScenarioError,
    check_file,
    parse,
    render,
    rewrite_requested,
)

TESTDATA = Path(__file__).resolve().parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_there_are_scenario_files() -> None:
    assert len(FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_scenario(path: Path) -> None:
    check_file(
        path, RaftEnv(), rewrite=rewrite_requested(), label=f"tests/raft/testdata/{path.name}"
    )


# -- the runner itself ---------------------------------------------------------------------------

SMALL = """\
# Two nodes: 1 is elected.
add-nodes 2
----
1: FOLLOWER term=0 voters=1,2 learners=- index=0
2: FOLLOWER term=0 voters=1,2 learners=- index=0

campaign 1
----
{campaign}

# a comment at the end is kept
"""


def test_a_wrong_expected_output_fails_with_a_diff_and_rewrite_fixes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "small.txt"
    path.write_text(SMALL.format(campaign="1 is now LEADER term=7 leader=1"))
    with pytest.raises(AssertionError) as failure:
        check_file(path, RaftEnv(), rewrite=False)
    message = str(failure.value)
    assert "-1 is now LEADER term=7 leader=1" in message
    assert "+1 is now PRE_CANDIDATE term=0 leader=-" in message
    assert f"{REWRITE_ENV}=1" in message

    monkeypatch.setenv(REWRITE_ENV, "1")
    assert rewrite_requested()
    check_file(path, RaftEnv(), rewrite=rewrite_requested())
    assert path.read_text() == SMALL.format(campaign="1 is now PRE_CANDIDATE term=0 leader=-")

    monkeypatch.delenv(REWRITE_ENV)
    assert not rewrite_requested()
    check_file(path, RaftEnv(), rewrite=False)  # passes now


def test_parse_and_render_round_trip() -> None:
    text = SMALL.format(campaign="x")
    sf = parse(text)
    assert [c.command for c in sf.cases] == ["add-nodes 2", "campaign 1"]
    assert sf.cases[1].preamble == []
    assert sf.trailer == ["# a comment at the end is kept"]
    assert render(sf) == text


def test_malformed_files_and_commands_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="not followed by `----`"):
        parse("add-nodes 1\nstatus 1\n")
    path = tmp_path / "bad.txt"
    path.write_text("add-nodes 1\n----\n\nfrobnicate 1\n----\n")
    with pytest.raises(ScenarioError, match=r"bad.txt:4: .*unknown command 'frobnicate'"):
        check_file(path, RaftEnv(), rewrite=True)
    path.write_text("add-nodes 1\n----\n\nstatus 9\n----\n")
    with pytest.raises(ScenarioError, match="no node '9'"):
        check_file(path, RaftEnv(), rewrite=True)


def test_the_runner_stops_on_two_leaders_in_a_term_or_diverging_applies(tmp_path: Path) -> None:
    # Two single-voter groups in one environment: each node rightly leads term 1 of its own
    # group, but the runner takes every node as a member of one group, so it must object.
    path = tmp_path / "two_leaders.txt"
    path.write_text(
        "add-nodes 1\n----\n\nadd-nodes 1\n----\n\ncampaign 1\n----\n\ncampaign 2\n----\n"
    )
    with pytest.raises(ScenarioError, match="two leaders in term 1: 1 and 2"):
        check_file(path, RaftEnv(), rewrite=True)

    env = RaftEnv()
    env.applied_at[1] = (9, EntryType.NORMAL, b"other")  # as if another node applied this
    path.write_text("add-nodes 1\n----\n\ncampaign 1\n----\n\nstabilize\n----\n")
    with pytest.raises(ScenarioError, match="1 applies 1@1 noop where another node applied term 9"):
        check_file(path, env, rewrite=True)
