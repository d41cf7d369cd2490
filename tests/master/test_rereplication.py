"""3-4-3 re-replication decisions (seed 004), pure: add a non-voter to promote for a failed
voter, remove the failed voter once the replacement is a voter, nothing without a live leader."""

from __future__ import annotations

import random
from dataclasses import replace

from service.common.ids import NodeId
from service.master.catalog_records import ConsensusState, MemberType, RaftPeer, TabletState
from service.master.placement_policy import ServerLoad
from service.master.report_processing import ConfigChange
from service.master.rereplication import plan_rereplication
from tests.master.test_report_processing import RUNNING, TABLE


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
    assert a is not None and a.change is ConfigChange.ADD_PEER
    assert a.leader == "ts-0" and a.cas_config_opid_index == 4
    assert a.peer.member_type is MemberType.NON_VOTER and a.peer.promote
    assert a.peer.uuid == "ts-3"  # live, not a peer, fewest replicas


def test_wait_while_the_replacement_catches_up() -> None:
    assert plan(tablet("ts-0", "ts-1", "ts-2", "+ts-3")) is None


def test_remove_the_failed_voter_once_the_replacement_is_a_voter() -> None:
    a = plan(tablet("ts-0", "ts-1", "ts-2", "ts-3", index=6))
    assert a is not None and a.change is ConfigChange.REMOVE_PEER
    assert a.peer.uuid == "ts-2" and a.cas_config_opid_index == 6


def test_a_failed_non_voter_is_removed() -> None:
    a = plan(tablet("ts-0", "ts-1", "ts-3", "+ts-2"))
    assert a is not None and a.change is ConfigChange.REMOVE_PEER and a.peer.uuid == "ts-2"


def test_nothing_without_a_live_leader_or_for_healthy_or_non_running_tablets() -> None:
    assert plan(tablet("ts-0", "ts-1", "ts-2", leader="ts-2")) is None
    assert plan(tablet("ts-0", "ts-1", "ts-3")) is None
    assert plan(replace(tablet("ts-0", "ts-1", "ts-2"), state=TabletState.CREATING)) is None


def test_nothing_when_no_live_server_is_free() -> None:
    only = [s for s in SERVERS if s.uuid in ("ts-0", "ts-1", "ts-2")]
    assert plan(tablet("ts-0", "ts-1", "ts-2"), servers=only) is None
