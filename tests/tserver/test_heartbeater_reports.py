"""What the tablet server's heartbeater reports to which master (service/tserver/heartbeater.py):
`Heartbeater._heartbeat` against scripted master answers (an in-memory transport; the real
stream is tested in test_heartbeat_stream.py and the whole exchange by the cluster tests).

What is acknowledged is committed in sys.catalog, so it stays acknowledged across a change of
leader: a new leader that defers our full report is sent, at once, exactly what changed
since the last acknowledgement, whichever master gave it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from service.pb import master_pb2 as pb
from service.tserver.heartbeater import Heartbeater, HeartbeatStream, MasterView
from service.tserver.tablet_manager import TabletManager


class Tablets:
    """The part of TabletManager the heartbeater reads: replicas and their reports."""

    def __init__(self) -> None:
        self.replicas: dict[str, pb.ReportedTabletPB] = {}
        self.listeners: list[Callable[[str], None]] = []

    def set(self, tablet_id: str, schema_version: int) -> None:
        self.replicas[tablet_id] = pb.ReportedTabletPB(
            tablet_id=tablet_id, schema_version=schema_version
        )

    def reported_tablet(self, r: pb.ReportedTabletPB) -> pb.ReportedTabletPB:
        return r

    def num_live(self) -> int:
        return len(self.replicas)

    def num_leaders(self) -> int:
        return 0


class Master:
    """A scripted master: answers each heartbeat with `answer(request)`, recording requests."""

    def __init__(self) -> None:
        self.requests: list[pb.TSHeartbeatRequestPB] = []
        self.answer: Callable[[pb.TSHeartbeatRequestPB], pb.TSHeartbeatResponsePB] = lambda req: (
            pb.TSHeartbeatResponsePB()
        )

    async def heartbeat(self, req: pb.TSHeartbeatRequestPB) -> pb.TSHeartbeatResponsePB:
        self.requests.append(req)
        return self.answer(req)


def leader(term: int, *, ack: bool = True, **flags: bool) -> Any:
    """Answers as leader of `term`, acknowledging the report (if any) when `ack`."""

    def answer(req: pb.TSHeartbeatRequestPB) -> pb.TSHeartbeatResponsePB:
        seq = req.tablet_report.sequence_number if ack and req.HasField("tablet_report") else 0
        return pb.TSHeartbeatResponsePB(
            leader_master=True, master_term=term, acked_report_sequence_number=seq, **flags
        )

    return answer


def make() -> tuple[Heartbeater, Tablets, MasterView, MasterView]:
    tablets = Tablets()
    highest = [0]  # the server's highest master term seen, as TabletServer keeps it
    hb = Heartbeater(
        ("a:1", "b:1"),
        pb.NodeInstancePB(permanent_uuid="ts", instance_seqno=1),
        lambda: pb.ServerRegistrationPB(),
        cast(TabletManager, tablets),
        interval_s=1.0,
        rpc_timeout_s=1.0,
        max_failures_before_backoff=3,
        on_master_term=lambda term: highest.__setitem__(0, max(highest[0], term)),
        highest_term=lambda: highest[0],
    )
    a, b = hb.views
    return hb, tablets, a, b


async def beat(hb: Heartbeater, view: MasterView, master: Master) -> pb.TSHeartbeatRequestPB:
    await hb._heartbeat(view, cast(HeartbeatStream, master))
    return master.requests[-1]


def reported(req: pb.TSHeartbeatRequestPB) -> tuple[bool, list[str], list[str]]:
    """(incremental, updated tablet ids, removed tablet ids) of a request's report."""
    rep = req.tablet_report
    return (
        rep.is_incremental,
        sorted(t.tablet_id for t in rep.updated_tablets),
        sorted(rep.removed_tablet_ids),
    )


def test_a_new_leader_that_defers_the_full_report_gets_the_changes_since_the_last_ack() -> None:
    async def main() -> None:
        hb, tablets, va, vb = make()
        a, b = Master(), Master()
        tablets.set("t1", 0)
        tablets.set("t2", 0)

        # Master a turns leader (first contact: no report yet) and asks for our full report.
        a.answer = leader(1, needs_full_tablet_report=True)
        assert not (await beat(hb, va, a)).HasField("tablet_report")
        assert va.is_leader and va.needs_full and hb._delay(va) < 0.1  # sent at once
        a.answer = leader(1)
        assert reported(await beat(hb, va, a)) == (False, ["t1", "t2"], [])
        assert not va.needs_full and hb.acked_term == 1

        # Things change; then a dies and b wins term 2, deferring our full report.
        tablets.set("t1", 1)
        tablets.set("t3", 0)
        del tablets.replicas["t2"]
        b.answer = leader(2, full_tablet_report_deferred=True)
        assert not (await beat(hb, vb, b)).HasField("tablet_report")  # b was a follower
        assert vb.is_leader and not vb.needs_full and hb._delay(vb) < 0.1
        # The next report to b: what changed since a's acknowledgement, nothing more.
        assert reported(await beat(hb, vb, b)) == (True, ["t1", "t3"], ["t2"])
        assert hb.acked_term == 2
        assert not (await beat(hb, vb, b)).HasField("tablet_report")  # nothing new

        # b's deposed predecessor acknowledging late is not taken over b's acknowledgement.
        tablets.set("t3", 1)
        a.answer = leader(1)
        va.is_leader = True
        assert reported(await beat(hb, va, a)) == (True, ["t3"], [])
        assert hb.acked_term == 2
        assert reported(await beat(hb, vb, b)) == (True, ["t3"], [])  # still owed to b

        # b's turn comes: the full report goes out at once.
        b.answer = leader(2, needs_full_tablet_report=True, ack=False)
        assert not (await beat(hb, vb, b)).HasField("tablet_report")
        assert vb.needs_full and hb._delay(vb) < 0.1
        b.answer = leader(2)
        assert reported(await beat(hb, vb, b)) == (False, ["t1", "t3"], [])
        assert not vb.needs_full

    asyncio.run(main())


def test_an_unacknowledged_report_is_sent_again_and_a_follower_gets_none() -> None:
    async def main() -> None:
        hb, tablets, va, vb = make()
        a, b = Master(), Master()
        tablets.set("t1", 0)
        a.answer = leader(1, full_tablet_report_deferred=True)
        await beat(hb, va, a)
        a.answer = leader(1, ack=False, full_tablet_report_deferred=True)  # shed
        assert reported(await beat(hb, va, a)) == (True, ["t1"], [])
        assert reported(await beat(hb, va, a)) == (True, ["t1"], [])
        b.answer = lambda req: pb.TSHeartbeatResponsePB(leader_master=False, master_term=1)
        assert not (await beat(hb, vb, b)).HasField("tablet_report")
        assert not (await beat(hb, vb, b)).HasField("tablet_report")

    asyncio.run(main())


def test_a_busy_leaders_slower_pace_is_kept_and_its_end_too() -> None:
    async def main() -> None:
        hb, _, va, _ = make()
        a = Master()
        a.answer = leader(1, heartbeat_interval_ms=4000)  # overloaded (heartbeat_pace.py)
        await beat(hb, va, a)
        assert hb._delay(va) < 0.1  # a new leader: the full report goes at once
        await beat(hb, va, a)
        assert va.is_leader and hb._delay(va) == 4.0
        a.answer = leader(1)  # recovered: 0 is the server's own interval again
        await beat(hb, va, a)
        assert hb._delay(va) == 1.0

    asyncio.run(main())


class _Wake:
    """The part of a master's heartbeat loop `_reprobe_others` touches: its wake-up event."""

    def __init__(self, view: MasterView) -> None:
        self.view = view
        self.wake = asyncio.Event()


def test_a_late_leader_is_tried_again_at_our_interval_and_lost_only_after_three_failures() -> None:
    async def main() -> None:
        hb, _, va, vb = make()
        a, b = Master(), Master()
        a.answer = leader(1, heartbeat_interval_ms=4000)  # busy: asks for a slower pace
        await beat(hb, va, a)
        assert hb._delay(va) < 0.1  # a new leader: the full report goes at once
        await beat(hb, va, a)
        b.answer = lambda req: pb.TSHeartbeatResponsePB(master_term=1, heartbeat_interval_ms=3000)
        await beat(hb, vb, b)
        assert va.is_leader and hb._delay(va) == 4.0 and hb._delay(vb) == 3.0
        loops = {v.address: _Wake(v) for v in (va, vb)}
        hb._loops = cast(Any, loops)

        for failures in (1, 2):
            hb._failed(va)  # a heartbeat to the busy leader timed out
            assert va.is_leader, failures  # late, not lost
            assert hb._delay(va) == 1.0  # tried again at our interval, not its slower pace
            assert loops["b:1"].wake.is_set()  # the follower is asked at once, once...
            loops["b:1"].wake.clear()
            await beat(hb, vb, b)
            assert hb._delay(vb) == 3.0  # ...and keeps its pace: a leader is still known
        hb._failed(va)
        assert not va.is_leader and hb.leader_address() is None  # lost
        assert hb._delay(vb) == 1.0  # every master at our interval until one leads
        await beat(hb, va, a)  # it answers again: the leader once more
        assert va.is_leader

    asyncio.run(main())


def test_a_newer_term_seen_in_an_admin_call_sends_the_reports_to_the_new_leader() -> None:
    """A busy leader asked for a slow pace, then died; the new leader's CreateTablet is the
    first this server hears of it (`saw_newer_term`): every loop is woken at once, the new
    leader answers as one, and the new replica's report goes to it on the next heartbeat."""

    async def main() -> None:
        hb, tablets, va, vb = make()
        a, b = Master(), Master()
        a.answer = leader(1, heartbeat_interval_ms=4000)
        await beat(hb, va, a)
        await beat(hb, va, a)  # the full report, acknowledged
        b.answer = lambda req: pb.TSHeartbeatResponsePB(master_term=1, heartbeat_interval_ms=3000)
        await beat(hb, vb, b)
        loops = {v.address: _Wake(v) for v in (va, vb)}
        hb._loops = cast(Any, loops)
        va.report_gap = vb.report_gap = 2.0
        hb.saw_newer_term()
        assert loops["a:1"].wake.is_set() and loops["b:1"].wake.is_set()
        assert vb.report_gap == 0.0
        tablets.set("new", 1)  # the replica the new leader's CreateTablet made
        b.answer = leader(2)
        await beat(hb, vb, b)
        assert vb.is_leader and not va.is_leader and hb._delay(vb) < 0.1
        assert reported(await beat(hb, vb, b)) == (False, ["new"], [])

    asyncio.run(main())


def test_a_new_leaders_answer_ends_a_late_leader_and_a_stale_answer_does_not() -> None:
    async def main() -> None:
        hb, _, va, vb = make()
        a, b = Master(), Master()
        a.answer = leader(1)
        await beat(hb, va, a)
        hb._loops = cast(Any, {v.address: _Wake(v) for v in (va, vb)})
        hb._failed(va)
        assert va.is_leader
        b.answer = leader(2)  # b won term 2 while a was late
        await beat(hb, vb, b)
        assert vb.is_leader and not va.is_leader and hb.leader_address() == "b:1"
        a.answer = leader(1)  # a, deposed, still says it leads term 1: not taken over b
        await beat(hb, va, a)
        assert vb.is_leader and not va.is_leader and hb.leader_address() == "b:1"

    asyncio.run(main())


def test_changes_wait_longer_while_a_leader_leaves_reports_unacknowledged() -> None:
    """A busy leader sheds reports (heartbeat.ReportGate) and asks for a slower pace: each
    report it leaves unacknowledged doubles the gap before a change brings our next heartbeat
    forward (up to the pace it asked for), each acknowledged one shortens it by a quarter, and
    a new leader hears our changes at once."""

    async def main() -> None:
        hb, tablets, va, vb = make()
        a, b = Master(), Master()
        hb._loops = cast(Any, {v.address: _Wake(v) for v in (va, vb)})
        a.answer = leader(1, ack=False, heartbeat_interval_ms=4000)  # busy: sheds, asks 4 s
        await beat(hb, va, a)  # no report yet: we learn it leads
        gaps = []
        for i in range(7):
            tablets.set(f"t{i}", 0)  # a change each time: a report goes with every heartbeat
            await beat(hb, va, a)
            gaps.append(round(va.report_gap, 3))
        assert gaps == [0.2, 0.4, 0.8, 1.6, 3.2, 4.0, 4.0]
        a.answer = leader(1, heartbeat_interval_ms=4000)  # keeps up again: acknowledged
        await beat(hb, va, a)
        assert va.report_gap == 3.0
        await beat(hb, va, a)  # nothing changed since: no report, the gap stays
        assert va.report_gap == 3.0
        for version in range(1, 21):
            tablets.set("t0", version)
            await beat(hb, va, a)
        assert va.report_gap == 0.0  # back to a change's own gap (MIN_GAP_S)

        a.answer = leader(1, ack=False)  # sheds at our own pace: at most one interval
        for i in range(6):
            tablets.set(f"u{i}", 0)
            await beat(hb, va, a)
        assert va.report_gap == 1.0
        b.answer = leader(2)  # b won term 2: our changes go to it at once
        await beat(hb, vb, b)
        assert vb.is_leader and vb.report_gap == 0.0 and va.report_gap == 0.0

    asyncio.run(main())


def test_a_restarted_follower_asking_to_reregister_gets_the_registration_at_once() -> None:
    """A master that restarted answers `needs_reregister`; it may win an election seconds
    later, so the registration goes at once, not after the follower's slow pace it asks for."""

    async def main() -> None:
        hb, _, va, vb = make()
        a, b = Master(), Master()
        a.answer = leader(1)
        await beat(hb, va, a)
        await beat(hb, va, a)
        b.answer = lambda req: pb.TSHeartbeatResponsePB(master_term=1, heartbeat_interval_ms=10_000)
        assert (await beat(hb, vb, b)).HasField("registration")
        assert not vb.needs_register and hb._delay(vb) == 10.0  # a follower's pace

        # b restarts: it knows no servers and asks for the registration again.
        b.answer = lambda req: pb.TSHeartbeatResponsePB(
            master_term=1, heartbeat_interval_ms=10_000, needs_reregister=True
        )
        assert not (await beat(hb, vb, b)).HasField("registration")
        assert vb.needs_register and hb._delay(vb) < 0.1  # at once
        # A master that asks again right after a registration is not sent one in a loop.
        assert (await beat(hb, vb, b)).HasField("registration")
        assert vb.needs_register and hb._delay(vb) == 10.0

    asyncio.run(main())
