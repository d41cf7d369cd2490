"""The snapshot policy of RaftNode (service/consensus/snapshots.py): when, at which index, and
with the membership as of that index."""

from __future__ import annotations

import pytest

from service.consensus.snapshots import ConfigHistory, SnapshotPlan, plan_snapshot
from service.raft import NodeId, RaftConfig


def cfg(*voters: str, index: int = 0) -> RaftConfig:
    return RaftConfig(frozenset(NodeId(v) for v in voters), frozenset(), index)


def test_config_history_answers_the_config_as_of_any_index_since_the_base() -> None:
    h = ConfigHistory(10, cfg("a", "b", "c"))
    h.applied(15, cfg("a", "b", "c", "d", index=15))
    h.applied(22, cfg("a", "b", "d", index=22))
    assert h.at(10) == h.at(14) == cfg("a", "b", "c")
    assert h.at(15) == h.at(21) == cfg("a", "b", "c", "d", index=15)
    assert h.at(30) == cfg("a", "b", "d", index=22)
    with pytest.raises(ValueError, match="history starts at 10"):
        h.at(9)


def test_config_history_folds_into_its_base_at_a_snapshot_and_restarts_at_an_install() -> None:
    h = ConfigHistory(0, cfg("a"))
    h.applied(5, cfg("a", "b", index=5))
    h.applied(9, cfg("a", "b", "c", index=9))
    h.snapshotted(7)
    assert (h.base_index, h.base) == (7, cfg("a", "b", index=5))
    assert h.changes == [(9, cfg("a", "b", "c", index=9))]
    h.applied(8, cfg("x"))  # an index already folded or passed is ignored
    assert h.at(8) == cfg("a", "b", index=5)
    h.reset(40, cfg("z", index=33))
    assert h.at(40) == cfg("z", index=33) and h.changes == []


def plan(**kw: int | bool) -> SnapshotPlan | None:
    args: dict[str, int | bool] = {
        "anchored": False,
        "applied": 0,
        "durable": 0,
        "last_snapshot": 0,
        "interval": 100,
        "waiting_for": 0,
    }
    args.update(kw)
    return plan_snapshot(**args)  # type: ignore[arg-type]


def test_a_state_snapshot_is_taken_every_interval_or_when_waited_for() -> None:
    assert plan(applied=99) is None
    assert plan(applied=100) == SnapshotPlan(100)
    assert plan(applied=150, last_snapshot=100) is None
    assert plan(applied=150, last_snapshot=100, waiting_for=120) == SnapshotPlan(150)
    assert plan(applied=100, last_snapshot=100, waiting_for=100) is None  # already there


def test_an_anchor_follows_the_durable_index_never_past_what_is_applied() -> None:
    kw: dict[str, int | bool] = {"anchored": True, "interval": 10_000}
    assert plan(applied=50, durable=0, **kw) is None  # nothing flushed yet
    assert plan(applied=50, durable=3, **kw) == SnapshotPlan(3)  # however few entries
    assert plan(applied=50, durable=3, last_snapshot=3, **kw) is None
    assert plan(applied=50, durable=80, last_snapshot=3, **kw) == SnapshotPlan(50)  # restart
    assert plan(applied=50, durable=40, last_snapshot=3, waiting_for=45, **kw) == SnapshotPlan(40)
