"""Full-report turns (service/master/report_turns.py) and the leader's answers that use them:
`handle_heartbeat` with a real `CatalogManager` (over `FakeRaft`), `TSManager` and
`ReportGate`.

A new leader wants every server's full report but asks only a few servers at a time
(`needs_full_tablet_report`); the others are told their turn has not come
(`full_tablet_report_deferred`) and send only their changes, which are processed and
acknowledged as usual. A full report sent in its turn waits for a reading slot rather than
being shed.
"""

from __future__ import annotations

import asyncio

import pytest

from service.common.errors import InvalidArgument
from service.master.catalog_records import TabletState
from service.master.heartbeat import HeartbeatContext, ReportGate, handle_heartbeat
from service.master.report_turns import FullReportTurns
from service.pb import master_pb2 as pb
from tests.helpers.catalog_env import Env, create, create_running, make_env
from tests.helpers.tablet_reports import heartbeat_context, leader_reports, report_entry

# --- the turns themselves (pure logic, the caller's clock) ----------------------------------


def test_at_most_max_turns_are_held_and_a_holder_keeps_its_turn() -> None:
    turns = FullReportTurns(max_turns=2, lapse_s=5.0)
    assert turns.take("a", 0.0) and turns.take("b", 0.0)
    assert not turns.take("c", 1.0)  # both held
    assert turns.take("a", 2.0)  # a holder asks again: still its turn, not a new one
    assert turns.given == 2 and turns.holding() == 2
    turns.done("a")  # a's full report was processed
    assert turns.take("c", 3.0) and not turns.take("d", 3.0)


def test_a_turn_lapses_and_goes_to_another() -> None:
    turns = FullReportTurns(max_turns=1, lapse_s=5.0)
    assert turns.take("a", 0.0)
    assert not turns.take("b", 4.9)
    assert turns.take("b", 5.0)  # a never sent its report (or it was never read)
    assert turns.lapsed == 1 and turns.holding() == 1
    # a comes back after its turn lapsed: it rests a lapse before it can have another, even
    # with a turn free (a server that never sends its report cannot keep asking for one).
    assert not turns.take("a", 6.0)
    turns.done("b")
    assert not turns.take("a", 9.9)
    assert turns.take("a", 10.0)
    assert turns.lapsed == 1 and turns.given == 3


def test_a_holder_that_never_reports_loses_its_turn_at_its_own_heartbeat() -> None:
    turns = FullReportTurns(max_turns=1, lapse_s=5.0)
    assert turns.take("a", 0.0)
    assert not turns.take("a", 5.0)  # lapsed: resting, though the only turn is now free
    assert turns.take("b", 5.1) and turns.lapsed == 1


def test_clear_ends_every_turn() -> None:
    turns = FullReportTurns(max_turns=1, lapse_s=5.0)
    assert turns.take("a", 0.0)
    turns.clear()
    assert turns.holding() == 0 and turns.take("b", 0.1)


@pytest.mark.parametrize(("max_turns", "lapse_s"), [(0, 5.0), (1, 0.0), (1, -1.0)])
def test_bad_settings_are_refused(max_turns: int, lapse_s: float) -> None:
    with pytest.raises(InvalidArgument, match="max_turns must be >= 1 and lapse_s > 0"):
        FullReportTurns(max_turns, lapse_s)


# --- a reading slot for a report sent in its turn ----------------------------------------------


def test_a_report_sent_in_its_turn_waits_for_a_reading_slot() -> None:
    async def main() -> None:
        gate = ReportGate(max_reading=1, budget_s=2.0)
        assert gate.start_reading()
        waiting = asyncio.ensure_future(gate.wait_reading())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        assert not gate.start_reading()  # a report without a turn does not jump the queue
        gate.done_reading()  # the slot passes to the waiter, not freed
        assert await waiting and gate.reading == 1 and gate.shed == 1
        gate.done_reading()
        assert gate.reading == 0

    asyncio.run(main())


def test_a_report_that_waited_too_long_is_shed_and_a_late_slot_is_passed_on() -> None:
    async def main() -> None:
        gate = ReportGate(max_reading=1, budget_s=0.1)
        assert gate.start_reading()
        assert not await gate.wait_reading()  # half the budget, then shed
        assert gate.shed == 1 and gate.reading == 1
        # A waiter cancelled (its heartbeat's caller hung up) right after it was handed the
        # slot gives the slot to the next waiter. (A budget the waiters cannot outlive on a
        # starved machine: with 0.1 s, a 50 ms stall of the loop shed them both.)
        gate.budget_s = 60.0
        first = asyncio.ensure_future(gate.wait_reading())
        second = asyncio.ensure_future(gate.wait_reading())
        await asyncio.sleep(0.01)
        gate.done_reading()
        first.cancel()
        assert await second and gate.reading == 1
        gate.done_reading()
        assert gate.reading == 0

    asyncio.run(main())


# --- the leader's answers -----------------------------------------------------------------------


def _heartbeat(uuid: str, report: pb.TabletReportPB | None = None) -> pb.TSHeartbeatRequestPB:
    req = pb.TSHeartbeatRequestPB(instance=pb.NodeInstancePB(permanent_uuid=uuid, instance_seqno=1))
    if report is not None:
        req.tablet_report.CopyFrom(report)
    return req


def _report(env: Env, uuid: str, *tables: str, full: bool, seq: int) -> pb.TabletReportPB:
    report = pb.TabletReportPB(is_incremental=not full, sequence_number=seq)
    for table_id in tables:
        for t in leader_reports(env, table_id).get(uuid, []):
            report.updated_tablets.append(report_entry(t))
    return report


def test_a_new_leader_asks_a_few_servers_at_a_time_and_tells_the_rest_to_wait() -> None:
    async def main() -> None:
        env = make_env(servers=3)
        old = await create_running(env, "old")
        env.ts.request_full_reports()  # a new leader: every full report is due
        gate = ReportGate(full_report_turns=1)
        ctx = heartbeat_context(env, gate)

        a = await handle_heartbeat(ctx, _heartbeat("ts-0"))
        b = await handle_heartbeat(ctx, _heartbeat("ts-1"))
        assert a.needs_full_tablet_report and not a.full_tablet_report_deferred
        assert b.full_tablet_report_deferred and not b.needs_full_tablet_report

        # ts-0 sends its full report in its turn: read, acknowledged, its turn ends...
        full = _report(env, "ts-0", old, full=True, seq=1)
        a = await handle_heartbeat(ctx, _heartbeat("ts-0", full))
        assert a.acked_report_sequence_number == 1
        assert not a.needs_full_tablet_report and not a.full_tablet_report_deferred
        assert not env.ts.needs_full_report("ts-0")
        # ...and the next server due gets it.
        b = await handle_heartbeat(ctx, _heartbeat("ts-1"))
        assert b.needs_full_tablet_report and not b.full_tablet_report_deferred
        c = await handle_heartbeat(ctx, _heartbeat("ts-2"))
        assert c.full_tablet_report_deferred

    asyncio.run(main())


def test_a_waiting_servers_changes_are_processed_and_acknowledged_at_once() -> None:
    """The point of it: a table created after an election turns RUNNING from the
    incremental reports of servers whose full report has not been read yet."""

    async def main() -> None:
        env = make_env(servers=3)
        old = await create_running(env, "old")
        new = await create(env, "new")
        await env.cm.assign_tablets()
        env.ts.request_full_reports()
        gate = ReportGate(full_report_turns=1)
        ctx = heartbeat_context(env, gate)
        assert (await handle_heartbeat(ctx, _heartbeat("ts-2"))).needs_full_tablet_report

        # A leader's claim is adopted once a follower's word confirms it (claims.py): the
        # first report of ts-0 may wait for ts-1's; the next ones are acknowledged at once.
        for seq, uuid in enumerate(("ts-0", "ts-1", "ts-0", "ts-1"), start=1):
            report = _report(env, uuid, new, full=False, seq=seq)
            answer = await handle_heartbeat(ctx, _heartbeat(uuid, report))
            assert answer.acked_report_sequence_number in ((seq,) if seq > 1 else (0, seq))
            assert answer.full_tablet_report_deferred  # its full report is still wanted
            assert env.ts.needs_full_report(uuid)
        states = {row.record.state for row in env.state.tablets_of(new)}
        assert states == {TabletState.RUNNING}
        assert {row.record.state for row in env.state.tablets_of(old)} == {TabletState.RUNNING}

    asyncio.run(main())


def test_a_full_report_sent_unasked_is_read_when_a_turn_is_free() -> None:
    """A server that does not wait for its turn (an older version, or one that just
    started) is served like any other while turns are free."""

    async def main() -> None:
        env = make_env(servers=3)
        old = await create_running(env, "old")
        env.ts.request_full_reports()
        gate = ReportGate(full_report_turns=1)
        ctx = heartbeat_context(env, gate)
        answer = await handle_heartbeat(
            ctx, _heartbeat("ts-1", _report(env, "ts-1", old, full=True, seq=4))
        )
        assert answer.acked_report_sequence_number == 4 and not env.ts.needs_full_report("ts-1")
        assert gate.turns.holding() == 0

    asyncio.run(main())


def test_a_follower_asks_for_nothing() -> None:
    async def main() -> None:
        env = make_env(servers=3)
        env.ts.request_full_reports()
        gate = ReportGate(full_report_turns=1)
        ctx = heartbeat_context(env, gate)
        follower = HeartbeatContext(**{**ctx.__dict__, "leading": False})
        answer = await handle_heartbeat(follower, _heartbeat("ts-0"))
        assert not answer.needs_full_tablet_report and not answer.full_tablet_report_deferred
        assert gate.turns.holding() == 0

    asyncio.run(main())
