"""TSManager (docs/design/failover.md#R2, and #R1: tablet servers heartbeat to all masters):
registration, re-register on unknown uuid, liveness on a ManualClock, restarts, full reports and
their tokens, warm registry across an election, loads exported for placement."""

from __future__ import annotations

from random import Random

import pytest

from service.common.clock import ManualClock
from service.common.config import MasterConfig
from service.common.errors import FailedPrecondition, InvalidArgument
from service.common.ids import NodeId
from service.master.placement_policy import ServerLoad, place_table, place_tablet
from service.master.ts_descriptor import NodeInstance, ReportToken, TSRegistration
from service.master.ts_manager import TSManager

TIMEOUT = 10.0


def inst(uuid: str, seqno: int = 1) -> NodeInstance:
    return NodeInstance(NodeId(uuid), seqno)


def reg(port: int = 7050, *, location: str | None = None, version: str = "1.0") -> TSRegistration:
    return TSRegistration(
        rpc_addresses=(f"10.0.0.1:{port}",),
        http_addresses=(f"10.0.0.1:{port + 1000}",),
        software_version=version,
        start_time=1_700_000_000.0,
        location=location,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=100.0)


@pytest.fixture
def mgr(clock: ManualClock) -> TSManager:
    return TSManager(clock, TIMEOUT)


# --- registration and lookup ----------------------------------------------------------------


def test_registration_records_the_server_live_and_due_a_full_report(
    mgr: TSManager, clock: ManualClock
) -> None:
    out = mgr.heartbeat(inst("ts-1", 5), reg())
    assert not out.needs_reregister and out.needs_full_report and not out.restarted
    d = out.descriptor
    assert d is not None
    assert (d.uuid, d.instance_seqno, d.rpc_address) == ("ts-1", 5, "10.0.0.1:7050")
    assert d.registration.http_address == "10.0.0.1:8050"
    assert d.registration.software_version == "1.0"
    assert d.live and d.heartbeat_age_s == 0.0
    assert d.first_registered == d.last_registered == d.last_heartbeat == 100.0
    assert d.needs_full_report and d.total_replicas == 0
    assert "ts-1" in mgr and len(mgr) == 1 and list(mgr.uuids()) == ["ts-1"]
    assert mgr.lookup(inst("ts-1", 5)) == d
    assert mgr.lookup(inst("ts-1", 4)) is None and mgr.lookup(inst("ts-2", 5)) is None


def test_num_leaders_is_the_server_s_latest_figure(mgr: TSManager) -> None:
    """Leadership moves without catalog writes: the listing shows what the server last said."""
    mgr.heartbeat(inst("ts-1", 5), reg(), num_leaders=3)
    assert mgr.lookup(inst("ts-1", 5)).num_leaders == 3  # type: ignore[union-attr]
    mgr.heartbeat(inst("ts-1", 5), num_leaders=1)
    assert mgr.lookup(inst("ts-1", 5)).num_leaders == 1  # type: ignore[union-attr]
    mgr.heartbeat(inst("ts-1", 5))  # a caller with no figure leaves it as it was
    assert mgr.lookup(inst("ts-1", 5)).num_leaders == 1  # type: ignore[union-attr]
    # An unknown process's figure is not recorded.
    assert mgr.heartbeat(inst("ts-1", 9), num_leaders=7).needs_reregister
    assert mgr.lookup(inst("ts-1", 5)).num_leaders == 1  # type: ignore[union-attr]


def test_unknown_uuid_heartbeating_without_registration_must_reregister(mgr: TSManager) -> None:
    out = mgr.heartbeat(inst("ts-1"))
    assert out.needs_reregister and out.needs_full_report
    assert out.descriptor is None and out.report_token is None
    assert len(mgr) == 0 and not mgr.is_live("ts-1") and mgr.get("ts-1") is None
    # The server does as told: registers, then heartbeats plainly.
    assert not mgr.heartbeat(inst("ts-1"), reg()).needs_reregister
    assert not mgr.heartbeat(inst("ts-1")).needs_reregister


def test_heartbeat_from_another_process_of_a_known_server_must_reregister(
    mgr: TSManager, clock: ManualClock
) -> None:
    mgr.heartbeat(inst("ts-1", 3), reg())
    clock.advance(4.0)
    for seqno in (2, 4):  # an old process's late message, a new process that did not register
        out = mgr.heartbeat(inst("ts-1", seqno))
        assert out.needs_reregister and out.descriptor is None
    d = mgr.get("ts-1")
    assert d is not None and d.last_heartbeat == 100.0  # liveness not recorded for them


def test_a_restarted_server_reregisters_with_a_higher_seqno_and_owes_a_full_report(
    mgr: TSManager, clock: ManualClock
) -> None:
    first = mgr.heartbeat(inst("ts-1", 1), reg(7050))
    assert first.report_token is not None
    assert mgr.full_report_processed(first.report_token)
    assert not mgr.needs_full_report("ts-1")
    clock.advance(30.0)  # down long enough to be dead
    assert not mgr.is_live("ts-1")
    out = mgr.heartbeat(inst("ts-1", 2), reg(7060, version="1.1"))
    assert out.restarted and out.needs_full_report and not out.needs_reregister
    d = out.descriptor
    assert d is not None and d.live and d.instance_seqno == 2
    assert d.rpc_address == "10.0.0.1:7060" and d.registration.software_version == "1.1"
    assert (d.first_registered, d.last_registered) == (100.0, 130.0)
    # The old token cannot clear the new process's report.
    assert not mgr.full_report_processed(first.report_token)
    assert mgr.needs_full_report("ts-1")


def test_rpc_address_is_the_latest_registration_s_without_a_snapshot(
    mgr: TSManager, clock: ManualClock
) -> None:
    assert mgr.rpc_address("ts-1") is None  # never registered here
    mgr.heartbeat(inst("ts-1", 1), TSRegistration(rpc_addresses=("a:7050", "b:7050")))
    assert mgr.rpc_address("ts-1") == "a:7050"  # the preferred (first) one
    clock.advance(30.0)
    assert not mgr.is_live("ts-1") and mgr.rpc_address("ts-1") == "a:7050"  # dead, not gone
    mgr.heartbeat(inst("ts-1", 2), reg(7060))  # restarted elsewhere
    assert mgr.rpc_address("ts-1") == "10.0.0.1:7060"
    d = mgr.get("ts-1")
    assert d is not None and d.rpc_address == mgr.rpc_address("ts-1")
    # A former process cannot move it back.
    with pytest.raises(FailedPrecondition):
        mgr.heartbeat(inst("ts-1", 1), reg(7050))
    assert mgr.rpc_address("ts-1") == "10.0.0.1:7060"


def test_a_registration_retry_with_the_same_seqno_is_accepted(mgr: TSManager) -> None:
    mgr.heartbeat(inst("ts-1", 1), reg(7050))
    out = mgr.heartbeat(inst("ts-1", 1), reg(7051))
    assert not out.needs_reregister and not out.restarted
    assert out.descriptor is not None and out.descriptor.rpc_address == "10.0.0.1:7051"


def test_a_registration_from_a_former_process_is_refused(mgr: TSManager) -> None:
    mgr.heartbeat(inst("ts-1", 5), reg(7050))
    with pytest.raises(FailedPrecondition, match="seqno 5 is already registered"):
        mgr.heartbeat(inst("ts-1", 4), reg(7099))
    d = mgr.get("ts-1")
    assert d is not None and (d.instance_seqno, d.rpc_address) == (5, "10.0.0.1:7050")


def test_register_returns_a_snapshot_and_counts_as_a_heartbeat(
    mgr: TSManager, clock: ManualClock
) -> None:
    mgr.register(inst("ts-1"), reg())
    clock.advance(9.0)
    d = mgr.register(inst("ts-1"), reg())
    assert d.last_heartbeat == 109.0 and d.live


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: NodeInstance(NodeId(""), 1), "invalid node id"),
        (lambda: NodeInstance(NodeId("ts 1"), 1), "invalid node id"),
        (lambda: NodeInstance(NodeId("ts-1"), -1), "instance_seqno"),
        (lambda: TSRegistration(()), "at least one rpc address"),
        (lambda: TSRegistration(("nohost",)), "host:port"),
        (lambda: TSRegistration(("h:0",)), "host:port"),
        (lambda: TSRegistration(("h:70000",)), "host:port"),
        (lambda: TSRegistration(("h:1", "h:1")), "duplicate rpc addresses"),
        (lambda: TSRegistration(("h:1",), http_addresses=("h",)), "http address"),
        (lambda: TSRegistration(("h:1",), location=""), "location"),
        (lambda: TSRegistration(("h:1",), start_time=-5.0), "start_time"),
        (lambda: TSManager(ManualClock(), 0.0), "unresponsive_timeout_s"),
    ],
)
def test_bad_input_is_invalid_argument(make: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        make()  # type: ignore[operator]


# --- liveness -------------------------------------------------------------------------------


def test_liveness_expires_after_the_timeout_and_revives_on_heartbeat(
    mgr: TSManager, clock: ManualClock
) -> None:
    mgr.heartbeat(inst("ts-1"), reg())
    clock.advance(TIMEOUT - 0.001)
    assert mgr.is_live("ts-1") and mgr.num_live() == 1
    clock.advance(0.001)  # age == timeout: dead (Kudu: live iff age < timeout)
    assert not mgr.is_live("ts-1") and mgr.num_live() == 0
    clock.advance(3600.0)
    d = mgr.get("ts-1")
    assert d is not None and not d.live and d.heartbeat_age_s == pytest.approx(TIMEOUT + 3600.0)
    assert len(mgr) == 1 and mgr.descriptors() == (d,)  # dead, never forgotten
    assert mgr.live_descriptors() == ()
    out = mgr.heartbeat(inst("ts-1"))
    assert not out.needs_reregister and out.descriptor is not None and out.descriptor.live
    assert mgr.num_live() == 1


def test_regular_heartbeats_keep_a_server_live_forever(mgr: TSManager, clock: ManualClock) -> None:
    mgr.heartbeat(inst("ts-1"), reg())
    for _ in range(1000):
        clock.advance(TIMEOUT * 0.9)
        assert mgr.is_live("ts-1")
        mgr.heartbeat(inst("ts-1"))


def test_presumed_dead_waits_a_full_timeout_for_servers_never_heard_from(
    mgr: TSManager, clock: ManualClock
) -> None:
    # A freshly started master: unknown means "not heard from yet", not dead.
    assert not mgr.presumed_dead("ts-9")
    mgr.heartbeat(inst("ts-1"), reg())
    clock.advance(TIMEOUT)
    assert mgr.presumed_dead("ts-9")  # a live server would have registered by now
    assert mgr.presumed_dead("ts-1")
    mgr.heartbeat(inst("ts-1"))
    assert not mgr.presumed_dead("ts-1")


def test_from_config_uses_the_unresponsive_timeout(tmp_path: object, clock: ManualClock) -> None:
    cfg = MasterConfig(data_dir=tmp_path, unresponsive_timeout_ms=2500)  # type: ignore[arg-type]
    assert TSManager.from_config(cfg, clock).unresponsive_timeout_s == 2.5


# --- full tablet reports ----------------------------------------------------------------------


def test_full_report_processed_clears_the_flag_only_for_the_latest_request(
    mgr: TSManager,
) -> None:
    token = mgr.heartbeat(inst("ts-1"), reg()).report_token
    assert token is not None and mgr.needs_full_report("ts-1")
    # A full report is being processed (replication awaits); meanwhile this master is
    # re-elected and asks everyone again: finishing the old report must not clear the new ask.
    mgr.request_full_reports()
    assert not mgr.full_report_processed(token)
    assert mgr.needs_full_report("ts-1")
    newer = mgr.heartbeat(inst("ts-1")).report_token
    assert newer is not None and mgr.full_report_processed(newer)
    assert not mgr.needs_full_report("ts-1")
    out = mgr.heartbeat(inst("ts-1"))
    assert not out.needs_full_report
    assert out.descriptor is not None and not out.descriptor.needs_full_report
    # Tokens for unknown servers are ignored; an unknown server always owes a report.
    assert not mgr.full_report_processed(ReportToken(NodeId("ghost"), 1, 1))
    assert mgr.needs_full_report("ghost")


def test_request_full_reports_marks_every_server_live_or_dead(
    mgr: TSManager, clock: ManualClock
) -> None:
    for i in range(5):
        token = mgr.heartbeat(inst(f"ts-{i}"), reg(7000 + i)).report_token
        assert token is not None and mgr.full_report_processed(token)
    clock.advance(TIMEOUT * 2)
    mgr.heartbeat(inst("ts-0"))
    assert not any(d.needs_full_report for d in mgr.descriptors())
    assert mgr.full_reports_due() == 0
    assert mgr.request_full_reports() == 5
    assert all(d.needs_full_report for d in mgr.descriptors())
    assert mgr.full_reports_due() == 5
    assert [d.live for d in mgr.descriptors()] == [True, False, False, False, False]


def test_fifty_servers_stay_live_across_an_election(clock: ManualClock) -> None:
    """docs/design/failover.md#R1 (KUDU-1358): a follower records heartbeats, so when it wins an
    election its registry is warm: all 50 servers live, none marked dead, placement works at once.
    The old design (a registry only the leader filled) starts empty and cannot place anything."""
    follower = TSManager(clock, unresponsive_timeout_s=3.0)
    servers = [inst(f"ts-{i:02d}") for i in range(50)]
    for i, s in enumerate(servers):
        follower.heartbeat(s, reg(7000 + i))

    def beat_for(seconds: float) -> None:
        # Heartbeats every second, staggered over the second, as 50 independent servers send.
        for _ in range(int(seconds)):
            for s in servers:
                clock.advance(1.0 / len(servers))
                out = follower.heartbeat(s)
                assert not out.needs_reregister
                assert follower.num_live() == 50

    beat_for(20)
    # The election: the follower becomes leader and asks for full reports. Nothing else.
    assert follower.request_full_reports() == 50
    assert follower.num_live() == 50
    assert all(d.needs_full_report for d in follower.descriptors())
    assert len(place_table(follower.server_loads(), "t", 100, 3, Random(0))) == 100
    # Reports arrive with the next heartbeats and are processed; nobody ever turns dead.
    for s in servers:
        clock.advance(1.0 / len(servers))
        token = follower.heartbeat(s).report_token
        assert token is not None and follower.full_report_processed(token)
        assert follower.num_live() == 50
    assert not any(d.needs_full_report for d in follower.descriptors())
    beat_for(20)

    old_design_leader = TSManager(clock, unresponsive_timeout_s=3.0)  # saw no heartbeats
    with pytest.raises(FailedPrecondition, match="need 3 live tablet servers, have 0"):
        place_tablet(old_design_leader.server_loads(), "t", 3, Random(0))


# --- replica counts and placement loads -----------------------------------------------------


def test_loads_are_exported_as_server_loads(mgr: TSManager, clock: ManualClock) -> None:
    mgr.heartbeat(inst("b"), reg(7001, location="r1"))
    mgr.heartbeat(inst("a"), reg(7000))
    mgr.heartbeat(inst("c"), reg(7002))
    mgr.set_replica_counts("a", {"t1": 2, "t2": 1})
    mgr.set_replica_counts("b", {"t1": 1})
    mgr.set_replica_counts("not-yet-registered", {"t1": 4})
    clock.advance(TIMEOUT / 2)
    mgr.heartbeat(inst("a"))
    mgr.heartbeat(inst("b"))
    clock.advance(TIMEOUT / 2)  # c is now dead
    assert mgr.server_loads() == (
        ServerLoad("a", True, 3, {"t1": 2, "t2": 1}),
        ServerLoad("b", True, 1, {"t1": 1}, location="r1"),
        ServerLoad("c", False, 0, {}),
    )
    # The counts of a server that registers later are already there.
    mgr.heartbeat(inst("not-yet-registered"), reg(7003))
    d = mgr.get("not-yet-registered")
    assert d is not None and d.total_replicas == 4
    # Placement on these loads: c is dead, a holds most of t1.
    for seed in range(10):
        assert place_tablet(mgr.server_loads(), "t1", 1, Random(seed)) == ("b",)


def test_replica_counts_replace_and_adjust(mgr: TSManager) -> None:
    mgr.heartbeat(inst("a"), reg(7000))
    mgr.heartbeat(inst("b"), reg(7001))
    mgr.replace_replica_counts({"a": {"t1": 3}, "b": {"t1": 1, "t2": 0}})
    assert dict(mgr.replica_counts("a")) == {"t1": 3}
    assert dict(mgr.replica_counts("b")) == {"t1": 1}
    mgr.adjust_replica_count("b", "t2", +2)
    mgr.adjust_replica_count("a", "t1", -3)
    assert dict(mgr.replica_counts("a")) == {}
    assert dict(mgr.replica_counts("b")) == {"t1": 1, "t2": 2}
    with pytest.raises(InvalidArgument, match="would become -1"):
        mgr.adjust_replica_count("a", "t1", -1)
    assert dict(mgr.replica_counts("a")) == {}
    mgr.replace_replica_counts({"a": {"t9": 1}})  # b not named: none
    assert [(d.uuid, d.total_replicas) for d in mgr.descriptors()] == [("a", 1), ("b", 0)]
    with pytest.raises(InvalidArgument):
        mgr.set_replica_counts("a", {"t1": -1})
    with pytest.raises(TypeError):
        mgr.replica_counts("a")["t9"] = 5  # type: ignore[index]


def test_descriptors_are_snapshots(mgr: TSManager, clock: ManualClock) -> None:
    mgr.heartbeat(inst("a"), reg())
    mgr.set_replica_counts("a", {"t1": 1})
    before = mgr.get("a")
    clock.advance(TIMEOUT)
    mgr.set_replica_counts("a", {"t1": 7})
    assert before is not None and before.live and before.total_replicas == 1
    with pytest.raises(AttributeError):
        before.live = False  # type: ignore[misc]
    after = mgr.get("a")
    assert after is not None and not after.live and after.total_replicas == 7
    assert after.to_server_load() == ServerLoad("a", False, 7, {"t1": 7})


def test_a_seqno_far_ahead_of_the_masters_clock_is_refused_and_changes_nothing(
    mgr: TSManager, clock: ManualClock
) -> None:
    """A server's seqno is its start time in microseconds: one hours ahead would lock every
    later process of that server out (a member's own certificate could do that to it)."""
    uuid = NodeId("ts-a")
    now_us = int(clock.now() * 1_000_000)
    mgr.heartbeat(NodeInstance(uuid, now_us), reg())
    with pytest.raises(InvalidArgument, match="ahead of this master's clock"):
        mgr.heartbeat(NodeInstance(uuid, now_us + 2 * 3600 * 1_000_000), reg())
    assert mgr.lookup(NodeInstance(uuid, now_us)) is not None
    later = NodeInstance(uuid, now_us + 60 * 1_000_000)  # a real restart a minute later
    assert mgr.heartbeat(later, reg()).restarted
