"""The tablet-server simulator's rules without a master: Raft's majority rule for leaders and
config changes, edge-triggered reports, and the same rule across shards over the bus.

Pure and fast: the simulator is driven through its admin operations and report builder
directly (no gRPC), except the shard test, which runs two simulators' buses on Unix sockets, and
the backoff test, whose heartbeats go to a port nothing listens on.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from service.common.errors import NotTheLeader, ServiceUnavailable
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.testing.ts_simulator import (
    COPY_AFTER_ROUNDS,
    COPY_RETRY_ROUNDS,
    FleetSimulator,
    _Peer,
    _View,
    commits,
    elect,
)
from service.testing.ts_simulator_shards import SocketBus, merge_stats, shard_uuids

MASTER = "127.0.0.1:1"


def _view(*voters: str) -> _View:
    return _View(1, [_Peer(u, True) for u in voters])


def test_elect_needs_a_majority_of_voters_and_keeps_a_live_leader() -> None:
    v = _view("a", "b", "c")
    assert not elect(v, {"a"}) and (v.leader, v.term) == ("", 0)
    assert elect(v, {"b", "c"}) and (v.leader, v.term) == ("b", 1)
    assert not elect(v, {"a", "b", "c"}) and (v.leader, v.term) == ("b", 1)  # stays
    assert elect(v, {"a", "c"}) and (v.leader, v.term) == ("a", 2)
    assert elect(v, {"c"}) and (v.leader, v.term) == ("", 2)  # lost the majority
    v.peers.append(_Peer("d", False))  # a NON_VOTER never makes a majority
    assert not elect(v, {"c", "d"}) and v.leader == ""
    assert not commits(_view("a", "b"), {"a"}) and commits(_view("a", "b"), {"a", "b"})


def _create(sim: FleetSimulator, tablet: str, dest: str, peers: list[str]) -> None:
    req = tpb.CreateTabletRequestPB(dest_uuid=dest, tablet_id=tablet, table_id="t1")
    req.config.opid_index = 1
    for u in peers:
        req.config.peers.add(permanent_uuid=u, member_type=mpb.VOTER)
    sim.create_tablet(req)


def _leaders_reported(sim: FleetSimulator, tablet: str) -> set[str]:
    out = set()
    for s in sim.servers.values():
        r = s.replicas.get(tablet)
        if r is not None and not r.tombstoned:  # a tombstone keeps its last view, inert
            out.add(sim._report(s, r).consensus_state.leader_uuid)
    return out


def test_a_tablet_leads_only_once_a_majority_of_its_replicas_exist() -> None:
    sim = FleetSimulator([MASTER], ["a", "b", "c"])
    _create(sim, "t", "c", ["a", "b", "c"])
    assert sim.leader_of("t") == "" and _leaders_reported(sim, "t") == {""}
    _create(sim, "t", "b", ["a", "b", "c"])
    assert sim.leader_of("t") == "b" and _leaders_reported(sim, "t") == {"b"}
    assert sim.groups["t"].view.term == 1
    _create(sim, "t", "a", ["a", "b", "c"])  # the first voter arrives: the leader stays
    assert sim.leader_of("t") == "b" and sim.groups["t"].view.term == 1
    assert sim.tablet_counts() == (3, 1)
    # Two servers stop: no majority, no leader; the survivor does not claim one.
    sim.stop_server("b")
    assert sim.leader_of("t") == "a" and sim.groups["t"].view.term == 2
    sim.stop_server("a")
    assert sim.leader_of("t") == ""
    assert sim._report(sim.servers["c"], sim.servers["c"].replicas["t"]).role == mpb.FOLLOWER
    assert sim.tablet_counts()[1] == 0
    sim.start_server("a")  # a restarted replica knows no leader until its group says so
    assert sim.leader_of("t") == "a" and sim.groups["t"].view.term == 3


def test_a_replica_never_created_is_never_counted() -> None:
    """The master placed a tablet on a, b and x; x is not simulated here (or its CreateTablet
    failed): a and b are a majority; with b tombstoned, a alone is not."""
    sim = FleetSimulator([MASTER], ["a", "b"])
    _create(sim, "t", "a", ["x", "a", "b"])
    assert sim.leader_of("t") == ""
    _create(sim, "t", "b", ["x", "a", "b"])
    assert sim.leader_of("t") == "a"
    sim.delete_tablet(
        tpb.DeleteTabletRequestPB(
            dest_uuid="b", tablet_id="t", delete_type=tpb.TABLET_DATA_TOMBSTONED
        )
    )
    assert sim.leader_of("t") == "" and _leaders_reported(sim, "t") == {""}


def test_the_leader_copies_a_member_whose_replica_was_never_created_or_was_lost() -> None:
    """A member of a led group with no live replica gets one from the leader after
    COPY_AFTER_ROUNDS rounds (as a Raft leader copies the tablet to a follower that answers it
    does not host it), again every COPY_RETRY_ROUNDS while its server is down; a replica that
    exists by then is left alone."""
    sim = FleetSimulator([MASTER], ["a", "b", "c"])
    _create(sim, "t", "a", ["a", "b", "c"])
    _create(sim, "t", "b", ["a", "b", "c"])  # c's CreateTablet never arrives
    assert sim.leader_of("t") == "a" and "t" not in sim.servers["c"].replicas
    for _ in range(COPY_AFTER_ROUNDS - 1):
        sim.owner_round()
    assert "t" not in sim.servers["c"].replicas and sim.copies_triggered == 0
    sim.owner_round()
    assert sim.copies_triggered == 1 and sim.groups["t"].live == {"a", "b", "c"}
    copied = sim.servers["c"].replicas["t"]
    assert not copied.tombstoned and copied.view.leader == "a"
    _create(sim, "t", "c", ["a", "b", "c"])  # the CreateTablet, late: the copy stays
    assert sim.servers["c"].replicas["t"] is copied
    for _ in range(2 * COPY_RETRY_ROUNDS):
        sim.owner_round()
    assert sim.copies_triggered == 1  # a complete group copies nothing

    # c loses its replica (deleted under the group): copied again.
    sim.delete_tablet(
        tpb.DeleteTabletRequestPB(dest_uuid="c", tablet_id="t", delete_type=tpb.TABLET_DATA_DELETED)
    )
    assert "t" not in sim.servers["c"].replicas
    for _ in range(COPY_AFTER_ROUNDS):
        sim.owner_round()
    assert sim.copies_triggered == 2 and "t" in sim.servers["c"].replicas

    # c is down: its kept replica is not live, copies to it are ignored until it is back.
    sim.stop_server("c")
    kept = sim.servers["c"].replicas["t"]
    for _ in range(COPY_AFTER_ROUNDS + COPY_RETRY_ROUNDS):
        sim.owner_round()
    assert sim.copies_triggered == 4 and sim.servers["c"].replicas["t"] is kept
    sim.start_server("c")
    assert sim.groups["t"].live == {"a", "b", "c"} and sim.servers["c"].replicas["t"] is kept

    # A trigger that crosses a replica created meanwhile leaves it alone.
    msg = {"k": "copy", "tablet": "t", "table": "t1", "server": "c", "trigger": True}
    sim.on_message({**msg, "view": sim.groups["t"].view.encode()})
    assert sim.servers["c"].replicas["t"] is kept


def _change(sim: FleetSimulator, dest: str, kind: int, peer: str) -> mpb.ConsensusStatePB:
    req = tpb.ChangeConfigRequestPB(dest_uuid=dest, tablet_id="t", type=kind)  # type: ignore[arg-type]
    req.peer.permanent_uuid = peer
    req.peer.member_type = mpb.NON_VOTER
    return asyncio.run(sim.change_config(req))


def test_a_config_change_commits_only_with_a_majority_of_the_new_config() -> None:
    sim = FleetSimulator([MASTER], ["a", "b", "c", "d"])
    for u in ("a", "b", "c"):
        _create(sim, "t", u, ["a", "b", "c"])
    assert sim.leader_of("t") == "a"
    with pytest.raises(NotTheLeader) as e:
        _change(sim, "b", tpb.ChangeConfigRequestPB.ADD_PEER, "d")
    assert e.value.leader_uuid == "a"
    sim.stop_server("c")
    # Removing b would leave voters {a, c} with only a live: 1 of 2 cannot commit.
    with pytest.raises(ServiceUnavailable, match="cannot commit"):
        _change(sim, "a", tpb.ChangeConfigRequestPB.REMOVE_PEER, "b")
    assert [p.uuid for p in sim.groups["t"].view.peers] == ["a", "b", "c"]
    cs = _change(sim, "a", tpb.ChangeConfigRequestPB.REMOVE_PEER, "c")
    assert [p.permanent_uuid for p in cs.committed_config.peers] == ["a", "b"]
    assert cs.leader_uuid == "a" and cs.committed_config.opid_index == 2
    # An added NON_VOTER gets its copy at once and becomes a voter a round later.
    _change(sim, "a", tpb.ChangeConfigRequestPB.ADD_PEER, "d")
    assert "t" in sim.servers["d"].replicas
    sim.rounds += 1
    sim._promote_caught_up()
    assert sim.groups["t"].view.voters() == ["a", "b", "d"]


def _registered_leader_links(sim: FleetSimulator) -> None:
    for s in sim.servers.values():
        link = s.links[MASTER]
        link.registered, link.leader, link.need_full = True, True, False
        s.dirty.clear()


def _report(sim: FleetSimulator, uuid: str) -> mpb.TabletReportPB:
    s = sim.servers[uuid]
    req = mpb.TSHeartbeatRequestPB()
    sent = sim.build_report(s, s.links[MASTER], req)
    assert sent is not None
    return req.tablet_report


def test_reports_are_edge_triggered_per_replica() -> None:
    """A change marks only the replicas it touches: an idle server reports nothing, a server
    whose one tablet got a new leader reports that tablet alone, and no other server any."""
    servers = [f"s{i}" for i in range(6)]
    sim = FleetSimulator([MASTER], servers)
    for n in range(300):
        peers = [servers[(n + k) % 6] for k in range(3)]
        for u in peers:
            _create(sim, f"t{n:03d}", u, peers)
    _registered_leader_links(sim)
    assert all(len(_report(sim, u).updated_tablets) == 0 for u in servers)
    # t000 is led by s0 (peers s0, s1, s2); stopping s0 moves only its tablets' leaders.
    led_by_s0 = {t for t, g in sim.groups.items() if g.view.leader == "s0"}
    touched = {t for t, r in sim.servers["s0"].replicas.items()}
    sim.stop_server("s0")
    for u in servers[1:]:
        rep = _report(sim, u)
        assert rep.is_incremental
        got = {t.tablet_id for t in rep.updated_tablets}
        assert got <= touched and got == {t for t in led_by_s0 if t in sim.servers[u].replicas}
    assert sim.reported["incremental"] == sum(
        len(led_by_s0 & set(sim.servers[u].replicas)) for u in servers[1:]
    )
    # Nothing changed since: every next report is empty, and a full one carries everything.
    assert all(len(_report(sim, u).updated_tablets) == 0 for u in servers[1:])
    sim.servers["s1"].links[MASTER].need_full = True
    assert len(_report(sim, "s1").updated_tablets) == len(sim.servers["s1"].replicas)


def test_an_unacknowledged_report_is_sent_again() -> None:
    sim = FleetSimulator([MASTER], ["a", "b", "c"])
    _registered_leader_links(sim)
    _create(sim, "t", "a", ["a", "b", "c"])
    s, link = sim.servers["a"], sim.servers["a"].links[MASTER]
    sent = sim.build_report(s, link, mpb.TSHeartbeatRequestPB())
    assert sent == (False, {"t"}) and not s.dirty
    s.dirty |= sent[1]  # what a failed or unacknowledged heartbeat does
    assert [t.tablet_id for t in _report(sim, "a").updated_tablets] == ["t"]


def test_a_full_report_is_built_once_and_follows_every_change() -> None:
    """A server sends its full report until one is acknowledged; it is built once and kept
    until one of the server's replicas changes (a new leader, a new replica, a removed one),
    and every full report says what a freshly built one would."""
    sim = FleetSimulator([MASTER], ["a", "b", "c"])
    _registered_leader_links(sim)
    for n in range(3):
        for u in ("a", "b", "c"):
            _create(sim, f"t{n}", u, ["a", "b", "c"])
    s = sim.servers["b"]
    s.links[MASTER].need_full = True

    def fresh() -> list[bytes]:
        return [sim._report(s, r).SerializeToString() for r in s.replicas.values()]

    def full() -> list[bytes]:
        rep = _report(sim, "b")
        assert not rep.is_incremental
        return [t.SerializeToString() for t in rep.updated_tablets]

    first = full()
    assert first == fresh() and s.full_report is not None
    cached = s.full_report
    assert full() == first and s.full_report is cached  # nothing changed: not rebuilt
    sim.stop_server("a")  # a's tablets get new leaders: b's view of them changes
    assert full() == fresh() != first
    _create(sim, "t9", "b", ["a", "b", "c"])  # a new replica
    assert "t9" in {t.tablet_id for t in _report(sim, "b").updated_tablets}
    assert full() == fresh()


def test_shards_apply_the_majority_rule_across_processes_buses() -> None:
    """Two shards, servers split between them: the owner of a tablet counts replicas created
    on the other shard, and each replica reports the leader only once two of three exist."""
    uuids = ["a", "b", "c", "d"]
    assert shard_uuids(uuids, 0, 2) == ["a", "c"] and shard_uuids(uuids, 1, 2) == ["b", "d"]

    async def main(directory: Path) -> None:
        buses = [SocketBus(i, 2, directory, uuids) for i in range(2)]
        sims = [FleetSimulator([MASTER], shard_uuids(uuids, i, 2), bus=buses[i]) for i in range(2)]
        for bus, sim in zip(buses, sims, strict=True):
            bus.on_message, bus.on_call = sim.on_message, sim.on_call
            await bus.start()
        try:
            tablet = next(t for t in (f"t{i}" for i in range(100)) if buses[0].owner_of(t) == 1)
            peers = ["a", "b", "c"]  # a, c on shard 0; b on shard 1 (the owner)
            _create(sims[0], tablet, "a", peers)
            await asyncio.sleep(0.2)
            assert sims[1].groups[tablet].view.leader == ""
            _create(sims[0], tablet, "c", peers)
            for _ in range(100):
                await asyncio.sleep(0.02)
                if sims[0].servers["a"].replicas[tablet].view.leader:
                    break
            assert sims[1].leader_of(tablet) == "a"
            assert sims[0].tablet_counts() == (2, 1)
            # ChangeConfig sent to shard 0's leader is decided by the owner on shard 1.
            req = tpb.ChangeConfigRequestPB(
                dest_uuid="c", tablet_id=tablet, type=tpb.ChangeConfigRequestPB.REMOVE_PEER
            )
            req.peer.permanent_uuid = "b"
            with pytest.raises(NotTheLeader) as e:
                await sims[0].change_config(req)
            assert e.value.leader_uuid == "a"
        finally:
            for bus in buses:
                await bus.aclose()

    with tempfile.TemporaryDirectory(prefix="tsim-") as tmp:
        asyncio.run(main(Path(tmp)))


def test_the_bus_refuses_a_directory_others_can_open() -> None:
    with tempfile.TemporaryDirectory(prefix="tsim-") as tmp:
        os.chmod(tmp, 0o755)
        with pytest.raises(PermissionError, match="0700"):
            asyncio.run(SocketBus(0, 2, Path(tmp), ["a", "b"]).start())


def test_merged_statistics_sum_counts_and_keep_the_worst_p99() -> None:
    merged = merge_stats(
        [
            {"replicas": 3, "leaders": 1, "recent_p99_s": 0.01, "errors": {"X": 1}},
            {"replicas": 4, "leaders": 2, "recent_p99_s": 0.03, "errors": {"X": 2}},
        ]
    )
    assert (merged["replicas"], merged["leaders"], merged["recent_p99_s"]) == (7, 3, 0.03)
    assert merged["errors"] == {"X": 3} and merged["shards"] == 2


class _ScriptedMaster:
    """A heartbeat stream whose master answers as leader of `term`, acknowledging each report
    (an in-memory transport: the simulator's own heartbeat path, no gRPC)."""

    def __init__(self, term: int, **flags: bool | int) -> None:
        self.term, self.flags = term, flags
        self.reports: list[mpb.TabletReportPB] = []
        self.ack = True
        """False: reports are shed (answered, not acknowledged)."""

    async def heartbeat(self, req: mpb.TSHeartbeatRequestPB) -> mpb.TSHeartbeatResponsePB:
        seq = 0
        if req.HasField("tablet_report"):
            self.reports.append(req.tablet_report)
            seq = req.tablet_report.sequence_number if self.ack else 0
        return mpb.TSHeartbeatResponsePB(
            leader_master=True,
            master_term=self.term,
            acked_report_sequence_number=seq,
            **self.flags,
        )

    def close(self) -> None:
        pass


def test_a_new_leader_that_defers_the_full_report_gets_the_changes_since_the_last_ack() -> None:
    """As the real heartbeater: what a leader acknowledged is committed, so a new leader that
    has not given this server its turn yet is sent exactly what changed since then; its turn
    brings the full report at once (out of the round), not a round later."""

    async def main() -> None:
        other = "127.0.0.1:2"
        sim = FleetSimulator([MASTER, other], ["a", "b", "c"])
        _create(sim, "t1", "a", ["a", "b", "c"])
        s = sim.servers["a"]
        old, new = _ScriptedMaster(1), _ScriptedMaster(2, full_tablet_report_deferred=True)
        sim._streams[("a", MASTER)] = old  # type: ignore[assignment]
        sim._streams[("a", other)] = new  # type: ignore[assignment]
        for link in s.links.values():
            link.registered = True
        s.links[MASTER].leader = True
        await sim._heartbeat(s, s.links[MASTER])  # the first leader reads the full report
        assert [r.is_incremental for r in old.reports] == [False] and not s.dirty

        _create(sim, "t2", "a", ["a", "b", "c"])  # then the leader dies; `other` wins
        s.links[MASTER].leader = False
        await sim._heartbeat(s, s.links[other])  # was a follower: no report yet
        assert not s.links[other].need_full and new.reports == []
        await asyncio.sleep(0.1)  # the prompt heartbeat to the new leader
        assert [[t.tablet_id for t in r.updated_tablets] for r in new.reports] == [["t2"]]
        assert new.reports[0].is_incremental and not s.dirty

        new.flags = {"needs_full_tablet_report": True}  # its turn
        await sim._heartbeat(s, s.links[other])
        await asyncio.sleep(0.1)
        assert not new.reports[-1].is_incremental and len(new.reports[-1].updated_tablets) == 2
        await sim.aclose()

    asyncio.run(main())


def test_a_shard_link_cut_by_shutdown_ends_without_an_error_in_the_log() -> None:
    """The fleet stops by cancelling its tasks, a shard's open incoming link among them. It
    must end as a shutdown, not as "Exception in callback ... CancelledError" from asyncio's
    stream server (which asks a finished connection task for its exception)."""
    errors: list[dict[str, Any]] = []

    async def main(directory: Path) -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        buses = [SocketBus(i, 2, directory, ["a", "b"]) for i in range(2)]
        got: list[dict[str, Any]] = []
        buses[1].on_message = got.append
        for bus in buses:
            await bus.start()
        buses[0].send(1, {"k": "note", "n": 1})
        for _ in range(200):
            if got:
                break
            await asyncio.sleep(0.01)
        assert got == [{"k": "note", "n": 1}]  # the link is open; shard 1 reads it
        for bus in buses:
            await bus.aclose()
        # Leaving now: asyncio.run cancels the tasks still reading the open link.

    with tempfile.TemporaryDirectory(prefix="tsim-") as tmp:
        os.chmod(tmp, 0o700)
        asyncio.run(main(Path(tmp)))
    assert errors == []


def test_a_link_whose_heartbeats_fail_backs_off_as_a_real_server() -> None:
    """A master that does not answer (nothing listens on MASTER) is heartbeated at the
    fleet's pace for `max_failures` failures, then after 2, 4, 8 and at most 10 intervals;
    an answer would reset the count. Real gRPC calls, each refused at once."""

    async def main() -> None:
        sim = FleetSimulator([MASTER], ["ts-1"], heartbeat_interval_s=1.0, rpc_timeout_s=2.0)
        await sim.start()
        try:
            assert sim._loop_task is not None
            sim._loop_task.cancel()  # rounds are driven below, one at a time
            link = sim.servers["ts-1"].links[MASTER]
            waits = []
            for _ in range(8):
                link.next_due = 0.0  # due now: each round below sends one heartbeat
                before = sim.heartbeats_failed
                await sim.beat_once()
                assert sim.heartbeats_failed == before + 1
                waits.append(round(link.next_due - time.monotonic() + 0.5) if link.next_due else 0)
            assert [link.failures] == [8]
            assert waits == [0, 0, 0, 2, 4, 8, 10, 10]
            # Not due during its backoff: a round leaves it alone.
            await sim.beat_once()
            assert sim.heartbeats_failed == 8
        finally:
            await sim.aclose()

    asyncio.run(main())


class _Follower(_ScriptedMaster):
    """A scripted master that answers as a follower of `term`, asking for a slower pace."""

    def __init__(self, term: int) -> None:
        super().__init__(term)
        self.heartbeats = 0

    async def heartbeat(self, req: mpb.TSHeartbeatRequestPB) -> mpb.TSHeartbeatResponsePB:
        self.heartbeats += 1
        return mpb.TSHeartbeatResponsePB(master_term=self.term, heartbeat_interval_ms=3000)


class _Dead:
    """The heartbeat stream of a master that died: every heartbeat fails at once."""

    async def heartbeat(self, req: mpb.TSHeartbeatRequestPB) -> mpb.TSHeartbeatResponsePB:
        raise ConnectionError("connection refused")

    def close(self) -> None:
        pass


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_leader_whose_heartbeats_fail_is_late_not_lost_until_max_failures() -> None:
    """The link taken for the leader fails (nothing listens on MASTER): each failure has every
    other master heartbeated at once, out of its pace (`_wake_links`, as the real
    heartbeater's `_failed` wakes its other loops), but the link stays the leader's for
    `max_failures - 1` failures, so the followers keep their slower pace meanwhile; the third
    failure in a row loses it. The leader's heartbeats are real gRPC calls, each refused at
    once; the follower is scripted."""
    other = "127.0.0.1:2"

    async def main() -> None:
        sim = FleetSimulator([MASTER, other], ["ts-1"], heartbeat_interval_s=1.0, rpc_timeout_s=2.0)
        await sim.start()
        try:
            assert sim._loop_task is not None
            sim._loop_task.cancel()  # rounds are driven below, one at a time
            s = sim.servers["ts-1"]
            follower_master = _Follower(1)
            sim._streams[("ts-1", other)] = follower_master  # type: ignore[assignment]
            lead, follower = s.links[MASTER], s.links[other]
            lead.leader, follower.registered = True, True
            leader_after = []
            for i in range(3):
                lead.next_due = 0.0
                follower.next_due = time.monotonic() + 100.0  # at a follower's pace
                before = sim.heartbeats_failed
                await sim.beat_once()  # only the leader's link is due: it fails...
                assert sim.heartbeats_failed == before + 1
                # ...and the follower is heartbeated at once, out of its pace
                await _until(lambda i=i: follower_master.heartbeats == i + 1)
                leader_after.append(lead.leader)
            assert leader_after == [True, True, False]
        finally:
            await sim.aclose()

    asyncio.run(main())


def test_a_newer_master_term_in_an_admin_call_finds_the_new_leader_at_once() -> None:
    """A busy leader asked for a slow pace, then died; the new leader's CreateTablet
    (fenced with its newer term) is the first this server hears of it. Every master is
    heartbeated at once (`_wake_links`, as the real server's `Heartbeater.saw_newer_term`), the
    new one answers as leader, and the new replica's report goes to it, not to the old."""

    async def main() -> None:
        other = "127.0.0.1:2"
        sim = FleetSimulator([MASTER, other], ["a", "b", "c"], heartbeat_interval_s=1.0)
        s = sim.servers["a"]
        new = _ScriptedMaster(2)
        sim._streams[("a", MASTER)] = _Dead()  # type: ignore[assignment]
        sim._streams[("a", other)] = new  # type: ignore[assignment]
        for link in s.links.values():
            link.registered, link.need_full = True, False
            link.next_due = time.monotonic() + 100.0  # nobody is due by pace
        s.links[MASTER].leader, s.highest_term = True, 1
        req = tpb.CreateTabletRequestPB(dest_uuid="a", tablet_id="t-new", table_id="t1")
        req.fence.master_uuid, req.fence.master_term = "m2", 2
        req.config.opid_index = 1
        for u in ("a", "b", "c"):
            req.config.peers.add(permanent_uuid=u, member_type=mpb.VOTER)
        sim.create_tablet(req)
        await _until(
            lambda: any(t.tablet_id == "t-new" for r in new.reports for t in r.updated_tablets)
        )
        assert s.links[other].leader and not s.links[MASTER].leader
        await sim.aclose()

    asyncio.run(main())


class _Restarted(_Follower):
    """A follower that restarted: it knows no servers, and asks for the registration until
    a heartbeat carries it."""

    def __init__(self, term: int) -> None:
        super().__init__(term)
        self.registrations = 0

    async def heartbeat(self, req: mpb.TSHeartbeatRequestPB) -> mpb.TSHeartbeatResponsePB:
        self.heartbeats += 1
        self.registrations += req.HasField("registration")
        return mpb.TSHeartbeatResponsePB(
            master_term=self.term,
            heartbeat_interval_ms=3000,
            needs_reregister=not self.registrations,
        )


def test_a_restarted_master_asking_to_reregister_is_sent_the_registration_next_round() -> None:
    """As the real heartbeater: a follower that answers `needs_reregister` (it restarted and
    knows no servers; it may win an election soon) is sent the registration in the next
    round, not after the slow pace it asks a follower's heartbeats to keep."""

    async def main() -> None:
        other = "127.0.0.1:2"
        sim = FleetSimulator([MASTER, other], ["a"], heartbeat_interval_s=1.0)
        sim.address = "127.0.0.1:3"  # what its registration names (not started: no port)
        s = sim.servers["a"]
        sim._streams[("a", MASTER)] = _ScriptedMaster(1)  # type: ignore[assignment]
        restarted = _Restarted(1)
        sim._streams[("a", other)] = restarted  # type: ignore[assignment]
        lead, follower = s.links[MASTER], s.links[other]
        lead.registered = follower.registered = True
        lead.leader, lead.next_due = True, time.monotonic() + 100.0
        follower.next_due = 0.0
        await sim.beat_once()  # a registered server's bare heartbeat: "register again"
        assert (restarted.heartbeats, restarted.registrations) == (1, 0)
        assert not follower.registered and follower.next_due <= time.monotonic()
        await sim.beat_once()  # the next round: registered
        assert (restarted.heartbeats, restarted.registrations) == (2, 1)
        assert follower.registered and follower.next_due > time.monotonic() + 2.0  # its pace
        await sim.aclose()

    asyncio.run(main())


def test_a_server_whose_reports_are_shed_waits_longer_before_reporting_again() -> None:
    """As the real heartbeater (`next_report_gap`): a changed server reports in the next round,
    but each report the leader leaves unacknowledged doubles the gap before the next (up to
    the pace the leader asks), and acknowledged ones shorten it again."""

    async def main() -> None:
        sim = FleetSimulator([MASTER], ["a", "b", "c"], heartbeat_interval_s=1.0)
        s = sim.servers["a"]
        master = _ScriptedMaster(1, heartbeat_interval_ms=4000)  # busy: asks for 4 s
        sim._streams[("a", MASTER)] = master  # type: ignore[assignment]
        link = s.links[MASTER]
        link.registered, link.leader, link.need_full = True, True, False
        master.ack = False
        gaps = []
        for i in range(6):
            _create(sim, f"t{i}", "a", ["a", "b", "c"])
            await sim._heartbeat(s, link)
            gaps.append(round(link.report_gap, 3))
            assert s.dirty  # shed: sent again later
        assert gaps == [0.2, 0.4, 0.8, 1.6, 3.2, 4.0]
        for srv in sim.servers.values():  # only `a` is due in a round: its pace and gap wait
            for ln in srv.links.values():
                ln.next_due = time.monotonic() + 100.0
        link.next_due = time.monotonic() + 100.0
        await sim.beat_once()
        assert len(master.reports) == 6  # dirty, but its report waits out the gap
        link.report_due = 0.0
        master.ack = True
        await sim.beat_once()  # the gap is over: the report goes, and is acknowledged
        assert len(master.reports) == 7 and not s.dirty and link.report_gap == 3.0
        await sim.aclose()

    asyncio.run(main())


def test_a_new_leader_hears_changes_at_once_whatever_gap_the_old_one_left() -> None:
    """The report gap is the leader's: when another master answers as leader of a newer
    term, the gap left by the old one goes with it (the real heartbeater's
    `_reprobe_others`)."""

    async def main() -> None:
        other = "127.0.0.1:2"
        sim = FleetSimulator([MASTER, other], ["a", "b", "c"], heartbeat_interval_s=1.0)
        s = sim.servers["a"]
        old, new = _ScriptedMaster(1, heartbeat_interval_ms=4000), _ScriptedMaster(2)
        sim._streams[("a", MASTER)] = old  # type: ignore[assignment]
        sim._streams[("a", other)] = new  # type: ignore[assignment]
        for link in s.links.values():
            link.registered, link.need_full = True, False
        s.links[MASTER].leader = True
        old.ack = False
        for i in range(4):
            _create(sim, f"t{i}", "a", ["a", "b", "c"])
            await sim._heartbeat(s, s.links[MASTER])
        assert s.links[MASTER].report_gap == 1.6
        await sim._heartbeat(s, s.links[other])  # term 2: `other` leads now
        assert s.links[other].leader and not s.links[MASTER].leader
        assert s.links[MASTER].report_gap == 0.0 and s.links[MASTER].report_due == 0.0
        assert s.links[other].report_gap == 0.0  # acknowledged at once
        await sim.aclose()

    asyncio.run(main())
