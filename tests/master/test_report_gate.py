"""The report gate (service/master/heartbeat.py, `ReportGate`): a heartbeat never waits on the
catalog for long. Over `max_in_flight` report writes a report waits its turn, and is shed if
the queue is full or no turn comes within `budget_s`; past `budget_s` the heartbeat goes on
without it; neither is acknowledged, and a late report's RPCs still go out once its write
commits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from service.common.config import MasterConfig
from service.common.errors import InvalidArgument, NotTheLeader
from service.common.ids import NodeId, TabletId
from service.master import heartbeat
from service.master.catalog_records import CatalogWrite
from service.master.heartbeat import ReportGate, decode_report, read_report
from service.master.report_processing import DeleteReplica, ReportAction, ReportPlan
from service.pb import master_pb2 as pb


class NeedsWrite:
    """`judge_report` of a report that changes the catalog: it must go through the gate
    (`quiet` reporters' reports change nothing and are answered at once)."""

    quiet: frozenset[str] = frozenset()

    def judge_report(
        self, reporter: NodeId, reported: list[Any], confirmed: Any = None
    ) -> ReportPlan:
        if reporter in self.quiet:
            action = DeleteReplica(TabletId("orphan"), reporter, False, None, "test")
            return ReportPlan(None, actions=(action,))
        return ReportPlan(CatalogWrite(ops=()))


class Catalog(NeedsWrite):
    """`process_report` that waits for `release` and returns a plan with one action."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []
        self.fail: Exception | None = None

    async def process_report(
        self,
        reporter: NodeId,
        reported: list[Any],
        judged: ReportPlan | None = None,
        confirmed: Any = None,
    ) -> ReportPlan:
        self.started.append(reporter)
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        action = DeleteReplica(TabletId("t-" + reporter), reporter, False, None, "test")
        return ReportPlan(None, actions=(action,))


def test_reports_over_the_limit_are_shed_and_late_ones_answered_without_them() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=2, budget_s=0.05)
        catalog = Catalog()
        submitted: list[ReportAction] = []

        def submit(actions: Any) -> None:
            submitted.extend(actions)

        loop = asyncio.get_running_loop()
        t0 = loop.time()
        results = await asyncio.gather(
            *(gate.process(catalog, NodeId(f"ts-{i}"), [], submit) for i in range(3))  # type: ignore[arg-type]
        )
        assert loop.time() - t0 < 1.0  # nobody waited for the catalog
        assert results == [None, None, None]
        assert catalog.started == ["ts-0", "ts-1"] and gate.shed == 1 and gate.late == 2
        assert gate.in_flight == 2 and submitted == []
        catalog.release.set()  # the late writes commit: their actions go out
        for _ in range(10):
            await asyncio.sleep(0)
        assert gate.in_flight == 0
        assert sorted(a.server for a in submitted) == ["ts-0", "ts-1"]  # type: ignore[attr-defined]
        plan = await gate.process(catalog, NodeId("ts-9"), [], submit)  # type: ignore[arg-type]
        assert plan is not None and plan.actions[0].server == "ts-9"  # type: ignore[attr-defined]

    asyncio.run(main())


class Stepped(NeedsWrite):
    """`process_report` that finishes each report when its own event is set."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.judged: dict[str, bool] = {}
        """Whether the gate handed its (still current) plan on: only to a report that did
        not wait for its turn."""

    async def process_report(
        self,
        reporter: NodeId,
        reported: list[Any],
        judged: ReportPlan | None = None,
        confirmed: Any = None,
    ) -> ReportPlan:
        self.started.append(reporter)
        self.judged[reporter] = judged is not None
        await self.release.setdefault(reporter, asyncio.Event()).wait()
        return ReportPlan(None, actions=())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_reports_over_the_limit_wait_their_turn_in_arrival_order() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=2, budget_s=5.0)
        catalog = Stepped()
        names = [f"ts-{i}" for i in range(5)]
        for n in names:
            catalog.release[n] = asyncio.Event()
        tasks = [
            asyncio.ensure_future(gate.process(catalog, NodeId(n), [], lambda _: None))  # type: ignore[arg-type]
            for n in names
        ]
        await settle()
        assert catalog.started == ["ts-0", "ts-1"] and gate.in_flight == 2
        catalog.release["ts-1"].set()  # one slot frees: the first waiter takes it
        await settle()
        assert catalog.started == ["ts-0", "ts-1", "ts-2"] and gate.in_flight == 2
        tasks[3].cancel()  # a waiter gives up (its heartbeat stream closed)
        catalog.release["ts-0"].set()
        await settle()
        assert catalog.started == ["ts-0", "ts-1", "ts-2", "ts-4"] and gate.in_flight == 2
        for n in names:
            catalog.release[n].set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[3], asyncio.CancelledError)
        assert all(isinstance(r, ReportPlan) for i, r in enumerate(results) if i != 3)
        assert gate.shed == 0 and gate.late == 0 and gate.in_flight == 0
        assert catalog.judged == {"ts-0": True, "ts-1": True, "ts-2": False, "ts-4": False}

    asyncio.run(main())


def test_a_report_beyond_the_waiting_queue_is_shed_at_once() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=1, budget_s=5.0, max_waiting=1)
        catalog = Stepped()
        tasks = [
            asyncio.ensure_future(gate.process(catalog, NodeId(n), [], lambda _: None))  # type: ignore[arg-type]
            for n in ("a", "b")
        ]
        await settle()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await gate.process(catalog, NodeId("c"), [], lambda _: None) is None  # type: ignore[arg-type]
        assert loop.time() - t0 < 1.0 and gate.shed == 1  # did not wait out the budget
        for n in ("a", "b"):
            catalog.release.setdefault(n, asyncio.Event()).set()
            await settle()
        assert all(isinstance(r, ReportPlan) for r in await asyncio.gather(*tasks))
        assert catalog.started == ["a", "b"]

    asyncio.run(main())


def test_a_report_that_changes_nothing_is_answered_at_once_even_when_the_gate_is_full() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=1, budget_s=5.0, max_waiting=0)
        catalog = Stepped()
        catalog.quiet = frozenset({"steady"})
        busy = asyncio.ensure_future(gate.process(catalog, NodeId("a"), [], lambda _: None))  # type: ignore[arg-type]
        await settle()
        assert gate.in_flight == 1
        plan = await gate.process(catalog, NodeId("steady"), [], lambda _: None)  # type: ignore[arg-type]
        assert plan is not None and plan.write is None and len(plan.actions) == 1
        assert catalog.started == ["a"] and gate.shed == 0  # never written, never shed
        catalog.release.setdefault("a", asyncio.Event()).set()
        await busy

    asyncio.run(main())


def test_a_slot_handed_to_a_waiter_that_is_cancelled_passes_to_the_next() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=1, budget_s=5.0)
        catalog = Stepped()
        for n in ("a", "b", "c"):
            catalog.release[n] = asyncio.Event()
        ta = asyncio.ensure_future(gate.process(catalog, NodeId("a"), [], lambda _: None))  # type: ignore[arg-type]
        await settle()
        tb = asyncio.ensure_future(gate.process(catalog, NodeId("b"), [], lambda _: None))  # type: ignore[arg-type]
        tc = asyncio.ensure_future(gate.process(catalog, NodeId("c"), [], lambda _: None))  # type: ignore[arg-type]
        await settle()
        catalog.release["a"].set()
        await asyncio.sleep(0)  # a finishes: the slot is handed to b, which has not resumed
        await asyncio.sleep(0)
        tb.cancel()  # ...and b is cancelled before it does: c must get the slot
        await settle()
        assert catalog.started == ["a", "c"]
        catalog.release["c"].set()
        await asyncio.gather(ta, tc)
        assert tb.cancelled() and gate.in_flight == 0

    asyncio.run(main())


def test_a_failed_report_write_propagates_in_time_and_is_only_logged_when_late() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=4, budget_s=0.05)
        catalog = Catalog()
        catalog.fail = NotTheLeader("deposed")
        catalog.release.set()
        with pytest.raises(NotTheLeader):
            await gate.process(catalog, NodeId("ts-1"), [], lambda _: None)  # type: ignore[arg-type]
        catalog.release = asyncio.Event()
        submitted: list[object] = []
        assert await gate.process(catalog, NodeId("ts-2"), [], submitted.extend) is None  # type: ignore[arg-type]
        catalog.release.set()
        for _ in range(10):
            await asyncio.sleep(0)
        assert submitted == [] and gate.in_flight == 0  # logged, nothing submitted

    asyncio.run(main())


def test_bad_gate_settings_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        ReportGate(max_in_flight=0)
    with pytest.raises(InvalidArgument, match="budget_s"):
        ReportGate(budget_s=0)
    with pytest.raises(InvalidArgument, match="max_waiting"):
        ReportGate(max_waiting=-1)


def test_the_gate_is_saturated_only_with_every_slot_and_the_queue_taken() -> None:
    async def main() -> None:
        gate = ReportGate(max_in_flight=1, budget_s=5.0, max_waiting=1)
        catalog = Stepped()
        assert not gate.saturated
        busy = asyncio.ensure_future(gate.process(catalog, NodeId("a"), [], lambda _: None))  # type: ignore[arg-type]
        await settle()
        assert gate.in_flight == 1 and not gate.saturated  # the queue has room
        waiting = asyncio.ensure_future(gate.process(catalog, NodeId("b"), [], lambda _: None))  # type: ignore[arg-type]
        await settle()
        assert gate.saturated  # a full report arriving now is shed before it is decoded
        for n in ("a", "b"):
            catalog.release.setdefault(n, asyncio.Event()).set()
            await settle()
        await asyncio.gather(busy, waiting)
        assert not gate.saturated

    asyncio.run(main())


def test_large_reports_are_read_a_few_at_a_time_and_the_rest_shed() -> None:
    gate = ReportGate(max_reading=2)
    assert gate.start_reading() and gate.start_reading()
    assert not gate.start_reading() and gate.shed == 1  # sent again with the next heartbeat
    gate.done_reading()
    assert gate.start_reading() and gate.reading == 2 and gate.shed == 1
    with pytest.raises(InvalidArgument, match="max_reading"):
        ReportGate(max_reading=0)


def _full_report(replicas: int, bad_at: int = -1, same: bool = False) -> pb.TabletReportPB:
    """`replicas` entries, each with its own consensus state (its own term) unless `same`; the
    one at `bad_at` lists a peer twice."""
    report = pb.TabletReportPB(is_incremental=False, sequence_number=1)
    for i in range(replicas):
        t = report.updated_tablets.add(
            tablet_id=f"{i:032x}", state=pb.REPLICA_RUNNING, role=pb.FOLLOWER
        )
        cs = t.consensus_state
        cs.current_term, cs.leader_uuid = (1 if same else 1 + i), "ts-a"
        cs.committed_config.opid_index = 1
        for uuid in ("ts-a", "ts-b", "ts-c" if i != bad_at else "ts-a"):
            cs.committed_config.peers.add(permanent_uuid=uuid, member_type=pb.VOTER)
    return report


def test_a_large_report_is_decoded_while_the_loop_keeps_running() -> None:
    """Decoding a full report of thousands of replicas takes the interpreter for tens of
    milliseconds: in a thread, the loop's other tasks (sys.catalog's Raft ticks) run
    meanwhile. The result and its errors are decode_report's."""
    report = _full_report(5_000)

    async def main() -> int:
        ticks = 0
        decoding = asyncio.ensure_future(read_report(report))
        while not decoding.done():
            await asyncio.sleep(0.001)
            ticks += 1
        assert decoding.result() == decode_report(report)
        return ticks

    assert asyncio.run(main()) >= 2
    with pytest.raises(InvalidArgument, match=r"updated_tablets\[70\].consensus_state"):
        asyncio.run(read_report(_full_report(100, bad_at=70)))


def test_a_consensus_state_reported_again_is_not_decoded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same bytes decode once (heartbeat._consensus_state); what comes back equals a fresh
    decode; a bad state fails every time, naming its own entry; the oldest are forgotten."""
    calls = []
    real = heartbeat.consensus_state_from_pb

    def counted(cs: pb.ConsensusStatePB, path: str) -> Any:
        calls.append(path)
        return real(cs, path)

    monkeypatch.setattr(heartbeat, "consensus_state_from_pb", counted)
    monkeypatch.setattr(heartbeat, "_decoded_states", {})
    same = _full_report(300, same=True)
    got = decode_report(same)
    assert len(calls) == 1 and all(e.consensus is got[0].consensus for e in got)
    assert got[0].consensus == real(same.updated_tablets[0].consensus_state, "x")
    for bad_at in (70, 70, 71):
        with pytest.raises(InvalidArgument, match=rf"updated_tablets\[{bad_at}\].consensus"):
            decode_report(_full_report(100, bad_at=bad_at, same=True))
    monkeypatch.setattr(heartbeat, "DECODED_STATES_KEPT", 10)
    many = _full_report(50)
    heartbeat._decoded_states.clear()
    calls.clear()
    assert [e.consensus for e in decode_report(many)] == [
        real(t.consensus_state, "x") for t in many.updated_tablets
    ]
    assert len(calls) == 50 and len(heartbeat._decoded_states) == 10
    decode_report(many, only=range(40, 50))  # the last 10 are kept ...
    assert len(calls) == 50
    decode_report(many, only=[0])  # ... the first forgotten
    assert len(calls) == 51


def test_the_gate_defaults_are_the_master_configs() -> None:
    def knobs(g: ReportGate) -> tuple[int, float, int]:
        return g.max_in_flight, g.budget_s, g.max_waiting

    assert knobs(ReportGate()) == knobs(ReportGate.from_config(MasterConfig(data_dir=Path("x"))))
    config = MasterConfig(
        data_dir=Path("x"),
        max_concurrent_tablet_reports=5,
        tablet_report_budget_ms=250,
        max_queued_tablet_reports=7,
    )
    assert knobs(ReportGate.from_config(config)) == (5, 0.25, 7)


def test_reports_deferred_for_unconfirmed_claims_are_counted_and_logged_once_per_interval() -> None:
    """Every such report is counted (the metric); a log line is due at most once per
    UNCONFIRMED_LOG_S and sums the reports and tablets deferred since the last one."""
    gate = ReportGate()
    every = heartbeat.UNCONFIRMED_LOG_S
    assert gate.note_unconfirmed(3, now=100.0) == (1, 3)  # the first is logged at once
    assert gate.note_unconfirmed(2, now=100.5) is None
    assert gate.note_unconfirmed(4, now=100.0 + every - 0.1) is None
    assert gate.note_unconfirmed(1, now=100.0 + every) == (3, 7)
    assert gate.note_unconfirmed(5, now=100.0 + every + 1) is None
    assert gate.unconfirmed == 5
