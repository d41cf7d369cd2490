"""The replica-change reconcilers judge settled configs only (service/client/replica_ops.py).

A move steps its source down when the source leads. The new leader reports the config it has
applied, which lags its log until an entry of its term commits: for a moment the promotion the
move waited for is pending there and the destination still shows as a non-voter. Reading that
as "someone demoted the destination" aborted a correct move (seen once in CI, under load). These
tests script the leader's answers through a fake `_Ops`: pure decision logic, no servers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from service.client import replica_ops
from service.client.replica_ops import ConcurrentConfigChange, ConsensusView
from service.client.retry import Deadline


def view(
    voters: str, non_voters: str = "", *, leader: str = "a", pending: bool = False, index: int = 5
) -> ConsensusView:
    return ConsensusView(
        tablet_id="t1",
        table_id="tb",
        leader_uuid=leader,
        leader_address=f"{leader}:1",
        opid_index=index,
        voters=frozenset(voters.split(",")),
        non_voters=frozenset(n for n in non_voters.split(",") if n),
        pending=pending,
    )


class ScriptedOps:
    """The `_Ops` surface the reconcilers use, answering reads from a script."""

    def __init__(self, reads: list[ConsensusView]) -> None:
        self.reads: Iterator[ConsensusView] = iter(reads)
        self.deadline = Deadline.after(5.0)
        self.changes: list[tuple[int, str, int]] = []
        self.step_downs: list[str] = []
        self.last: ConsensusView | None = None

    async def read(self, tablet_id: str) -> ConsensusView:
        self.last = next(self.reads)
        return self.last

    async def pause(self) -> None:
        await asyncio.sleep(0)

    async def step_down(self, v: ConsensusView) -> None:
        self.step_downs.append(v.leader_uuid)

    async def change(self, v: ConsensusView, kind: int, peer: object) -> None:
        self.changes.append((kind, peer.permanent_uuid, v.opid_index))  # type: ignore[attr-defined]


def placed(to: str):  # the move's `still_placed` check
    def check(v: ConsensusView) -> None:
        if to not in v.voters:
            raise ConcurrentConfigChange(f"{to} is no longer a voter ({v.describe()})")

    return check


def test_removal_waits_out_a_new_leaders_pending_promotion() -> None:
    ops = ScriptedOps(
        [
            view("a,b,c,d"),  # a leads and is the source: step down
            # b was elected; its applied config still has d as the non-voter it was
            view("b,c,a", "d", leader="b", pending=True, index=4),
            view("a,b,c,d", leader="b"),  # settled: remove a
            view("b,c,d", leader="b", index=6),
        ]
    )
    done = asyncio.run(replica_ops._ensure_removed(ops, "t1", "a", placed("d")))  # type: ignore[arg-type]
    assert ops.step_downs == ["a"]
    assert ops.changes == [(replica_ops.CC.REMOVE_PEER, "a", 5)]
    assert done.voters == {"b", "c", "d"}


def test_removal_still_stops_when_the_destination_really_left() -> None:
    ops = ScriptedOps([view("a,b,c", leader="b", index=7)])
    with pytest.raises(ConcurrentConfigChange, match="d is no longer a voter"):
        asyncio.run(replica_ops._ensure_removed(ops, "t1", "a", placed("d")))  # type: ignore[arg-type]
    assert ops.changes == [] and ops.step_downs == []


def test_promotion_wait_tolerates_a_pending_add_and_stops_on_a_settled_removal() -> None:
    ops = ScriptedOps([view("b,c,a", leader="b", pending=True), view("a,b,c,d", leader="b")])
    got = asyncio.run(replica_ops._await_voter(ops, "t1", "d"))  # type: ignore[arg-type]
    assert "d" in got.voters
    ops = ScriptedOps([view("a,b,c", leader="b")])
    with pytest.raises(ConcurrentConfigChange, match="left the config before its promotion"):
        asyncio.run(replica_ops._await_voter(ops, "t1", "d"))  # type: ignore[arg-type]


def test_a_removal_found_committed_returns_whatever_else_is_pending() -> None:
    ops = ScriptedOps([view("b,c,d", "e", leader="b", pending=True, index=9)])
    done = asyncio.run(replica_ops._ensure_removed(ops, "t1", "a", placed("d")))  # type: ignore[arg-type]
    assert done.voters == {"b", "c", "d"} and ops.changes == [] and ops.step_downs == []
