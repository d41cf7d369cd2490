"""3-4-3 re-replication decisions (docs/design/tablet_copy.md#R7), pure: add a non-voter to promote
for a failed voter, remove the failed voter once the replacement is a voter, nothing without a live
leader; a replica its server reports FAILED is failed at once, and tombstoned once replaced."""

from __future__ import annotations

import random
from dataclasses import replace

from service.common.ids import NodeId, TabletId
from service.master.catalog_records import ConsensusState, MemberType, RaftPeer, TabletState
from service.master.placement_policy import ServerLoad
from service.master.report_processing import (
    ConfigChangeType,
    ReportedRole,
    ReportedState,
    ReportedTablet,
)
from service.master.rereplication import FailedReplicas, plan_failed_cleanup, plan_rereplication
from tests.helpers.tablet_reports import RUNNING, TABLE


def peers(*spec: str) -> tuple[RaftPeer, ...]:
    """ "ts-0" a voter, "+ts-3" a non-voter to promote."""
    return tuple(
        RaftPeer(NodeId(s[1:]), MemberType.NON_VOTER, promote=True)
        if s.startswith("+")
        else RaftPeer(NodeId(s), MemberType.VOTER)
        for s in spec
    )


def tablet(*spec: str, leader: str = "ts-0", index: int = 4):  # type: ignore[no-untyped-def]
    return replace(RUNNING, consensus=ConsensusState(2, index, peers(*spec), NodeId(leader)))


SERVERS = [ServerLoad(f"ts-{i}", live=i != 2, total_replicas=i) for i in range(5)]


def plan(t, failed=("ts-2",), servers=SERVERS):  # type: ignore[no-untyped-def]
    return plan_rereplication(t, TABLE, set(failed).__contains__, servers, {}, random.Random(1))


def test_failed_voter_gets_a_non_voter_to_promote_with_cas() -> None:
    a = plan(tablet("ts-0", "ts-1", "ts-2"))
    assert a is not None and a.change is ConfigChangeType.ADD_PEER
    assert a.leader == "ts-0" and a.cas_config_opid_index == 4
    assert a.peer.member_type is MemberType.NON_VOTER and a.peer.promote
    assert a.peer.uuid == "ts-3"  # live, not a peer, fewest replicas


def test_wait_while_the_replacement_catches_up() -> None:
    assert plan(tablet("ts-0", "ts-1", "ts-2", "+ts-3")) is None


def test_remove_the_failed_voter_once_the_replacement_is_a_voter() -> None:
    a = plan(tablet("ts-0", "ts-1", "ts-2", "ts-3", index=6))
    assert a is not None and a.change is ConfigChangeType.REMOVE_PEER
    assert a.peer.uuid == "ts-2" and a.cas_config_opid_index == 6


def test_a_failed_non_voter_is_removed() -> None:
    a = plan(tablet("ts-0", "ts-1", "ts-3", "+ts-2"))
    assert a is not None and a.change is ConfigChangeType.REMOVE_PEER and a.peer.uuid == "ts-2"


def test_nothing_without_a_live_leader_or_for_healthy_or_non_running_tablets() -> None:
    assert plan(tablet("ts-0", "ts-1", "ts-2", leader="ts-2")) is None
    assert plan(tablet("ts-0", "ts-1", "ts-3")) is None
    assert plan(replace(tablet("ts-0", "ts-1", "ts-2"), state=TabletState.CREATING)) is None


def test_nothing_when_no_live_server_is_free() -> None:
    only = [s for s in SERVERS if s.uuid in ("ts-0", "ts-1", "ts-2")]
    assert plan(tablet("ts-0", "ts-1", "ts-2"), servers=only) is None


# --- FAILED replicas: replaced at once, then tombstoned ---------------------------------------


def reported(tablet_id: str, state: ReportedState) -> ReportedTablet:
    return ReportedTablet(TabletId(tablet_id), state, ReportedRole.UNKNOWN, None)


def test_a_replica_reported_failed_is_replaced_at_once_by_a_server_that_is_alive() -> None:
    known = FailedReplicas()
    t = tablet("ts-0", "ts-1", "ts-3")  # every server alive: nothing to evict for death
    assert plan(t, failed=()) is None
    assert known.note_report("ts-3", [reported(t.tablet_id, ReportedState.FAILED)], full=True)
    a = plan(t, failed=known.servers_of(t.tablet_id))
    assert a is not None and a.change is ConfigChangeType.ADD_PEER and a.peer.uuid == "ts-4"
    assert "voter ts-3 of tablet" in a.reason


def test_failed_replicas_follow_full_and_incremental_reports() -> None:
    known = FailedReplicas()
    up, down, gone = ReportedState.RUNNING, ReportedState.FAILED, ReportedState.TOMBSTONED
    # A full report: its FAILED replicas, and new work (True).
    assert known.note_report("ts-1", [reported("t1", down), reported("t2", up)], full=True)
    assert known.servers_of("t1") == {"ts-1"} and not known.servers_of("t2") and len(known) == 1
    # Told again: nothing new. Another server's: its own entry.
    assert not known.note_report("ts-1", [reported("t1", down)], full=False)
    assert known.note_report("ts-2", [reported("t1", down), reported("t3", down)], full=False)
    assert known.servers_of("t1") == {"ts-1", "ts-2"} and known.tablet_ids() == {"t1", "t3"}
    # Incremental: only the replicas it names change (t1 on ts-2 tombstoned, t3 untouched).
    assert not known.note_report("ts-2", [reported("t1", gone)], full=False)
    assert known.servers_of("t1") == {"ts-1"} and known.servers_of("t3") == {"ts-2"}
    # Full: replaces what was known of the server (a restart, or a new leader asking).
    assert not known.note_report("ts-2", [reported("t1", up)], full=True)
    assert not known.servers_of("t3") and len(known) == 1
    known.clear()
    assert len(known) == 0 and not known.tablet_ids()


def test_a_replaced_failed_replica_is_tombstoned_with_cas_and_a_member_is_not() -> None:
    t = tablet("ts-0", "ts-1", "ts-4", index=9)  # ts-3's replica was replaced by ts-4's
    (d,) = plan_failed_cleanup(t, {"ts-3", "ts-1"})  # ts-1 still a member: left alone
    assert d.server == "ts-3" and d.tombstone and d.cas_config_opid_index == 9
    assert d.tablet_id == t.tablet_id and "was replaced" in d.reason
    assert plan_failed_cleanup(replace(t, state=TabletState.DELETED), {"ts-3"}) == ()
    assert plan_failed_cleanup(replace(t, consensus=None), {"ts-3"}) == ()
