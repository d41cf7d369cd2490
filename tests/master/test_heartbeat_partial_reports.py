"""A new leader's full reports and a table created meanwhile: `handle_heartbeat` with a real
`CatalogManager` (over `FakeRaft`) and a real `ReportGate`.

After an election every server sends full reports until one is read, and the leader reads only
a few at a time. A full report shed for want of a reading slot still has its entries about
CREATING tablets read and processed (a partial report): the new table turns RUNNING without
waiting for the whole fleet's full reports. A partial report is never acknowledged, so the
server keeps sending its full report until the leader reads all of it.
"""

from __future__ import annotations

import asyncio

import pytest

from service.common.errors import InvalidArgument
from service.common.ids import NodeId, TableId
from service.master.catalog_records import TabletState
from service.master.heartbeat import (
    ReportGate,
    handle_heartbeat,
    urgent_entries,
)
from service.pb import master_pb2 as pb
from tests.helpers.catalog_env import Env, create, create_running, make_env
from tests.helpers.tablet_reports import heartbeat_context, leader_reports, report_entry

REPORTER = "ts-0"


def _full_report_request(env: Env, *tables: TableId, seq: int = 7) -> pb.TSHeartbeatRequestPB:
    """ts-0's full report: every replica it hosts of `tables`, as their leaders report them."""
    report = pb.TabletReportPB(is_incremental=False, sequence_number=seq)
    for table_id in tables:
        for t in leader_reports(env, table_id)[REPORTER]:
            report.updated_tablets.append(report_entry(t))
    return pb.TSHeartbeatRequestPB(
        instance=pb.NodeInstancePB(permanent_uuid=REPORTER, instance_seqno=1),
        tablet_report=report,
    )


def _states(env: Env, table_id: TableId) -> set[TabletState]:
    return {row.record.state for row in env.state.tablets_of(table_id)}


async def _new_leader_with_a_creating_table() -> tuple[Env, TableId, TableId]:
    """A catalog with a RUNNING table (the bulk of every full report) and a table whose
    tablets are CREATING; every server's full report is still wanted (a new leader)."""
    env = make_env(servers=3)
    old = await create_running(env, "old")
    new = await create(env, "new")
    await env.cm.assign_tablets()
    assert _states(env, new) == {TabletState.CREATING}
    assert env.ts.request_full_reports() == 3
    # The other servers have spoken already (their incremental reports): their words confirm
    # the reporter's claims to lead (claims.py).
    for uuid, tablets in leader_reports(env, new).items():
        if uuid != REPORTER:
            env.cm.note_replica_states(NodeId(uuid), tablets, full=False)
    return env, old, new


def test_a_shed_full_report_still_turns_creating_tablets_running_unacknowledged() -> None:
    async def main() -> None:
        env, old, new = await _new_leader_with_a_creating_table()
        gate = ReportGate(max_reading=1)
        assert gate.start_reading()  # another server's full report holds the only slot
        request = _full_report_request(env, old, new)
        proposals = env.raft.proposals

        answer = await handle_heartbeat(heartbeat_context(env, gate), request)

        assert _states(env, new) == {TabletState.RUNNING}
        assert env.raft.proposals == proposals + 1  # the partial report: one write
        assert answer.acked_report_sequence_number == 0  # not the whole report: sent again
        assert answer.needs_full_tablet_report
        assert gate.shed == 1

        # Once a slot is free the whole report is read, acknowledged, and no longer wanted.
        gate.done_reading()
        answer = await handle_heartbeat(heartbeat_context(env, gate), request)
        assert answer.acked_report_sequence_number == 7
        assert not answer.needs_full_tablet_report

    asyncio.run(main())


def test_a_shed_full_report_without_creating_tablets_changes_nothing() -> None:
    async def main() -> None:
        env, old, new = await _new_leader_with_a_creating_table()
        gate = ReportGate(max_reading=1)
        assert gate.start_reading()
        proposals = env.raft.proposals

        # ts-0's report of the old table only: nothing in it is CREATING, nothing is read.
        answer = await handle_heartbeat(
            heartbeat_context(env, gate), _full_report_request(env, old)
        )

        assert env.raft.proposals == proposals
        assert answer.acked_report_sequence_number == 0 and answer.needs_full_tablet_report
        assert _states(env, new) == {TabletState.CREATING}

    asyncio.run(main())


def test_a_partial_report_with_a_bad_entry_is_refused_and_changes_nothing() -> None:
    async def main() -> None:
        env, old, new = await _new_leader_with_a_creating_table()
        gate = ReportGate(max_reading=1)
        assert gate.start_reading()
        request = _full_report_request(env, old, new)
        creating = env.cm.creating_tablets()
        bad = next(t for t in request.tablet_report.updated_tablets if t.tablet_id in creating)
        bad.state = 99
        proposals = env.raft.proposals

        with pytest.raises(InvalidArgument, match=r"\.state: unknown replica state 99"):
            await handle_heartbeat(heartbeat_context(env, gate), request)
        assert env.raft.proposals == proposals
        assert _states(env, new) == {TabletState.CREATING}

    asyncio.run(main())


def test_urgent_entries_picks_only_creating_tablets_and_at_most_a_bound() -> None:
    report = pb.TabletReportPB()
    ids = [f"{i:032x}" for i in range(200)]
    for tablet_id in ids:
        report.updated_tablets.add(tablet_id=tablet_id)
    assert urgent_entries(report, frozenset()) == []
    assert urgent_entries(report, {ids[3], ids[150], "f" * 32}) == [3, 150]
    many = urgent_entries(report, set(ids))
    assert many == list(range(64))
