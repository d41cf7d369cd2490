"""The report gate (service/master/heartbeat.py, `ReportGate`): a heartbeat never waits on the
catalog for long. Over `max_in_flight` report writes a report is shed; past `budget_s` the
heartbeat goes on without it; neither is acknowledged, and a late report's RPCs still go out
once its write commits."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from service.common.errors import InvalidArgument, NotTheLeader
from service.common.ids import NodeId, TabletId
from service.master.heartbeat import ReportGate
from service.master.report_processing import DeleteReplica, ReportAction, ReportPlan


class Catalog:
    """`process_report` that waits for `release` and returns a plan with one action."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []
        self.fail: Exception | None = None

    async def process_report(self, reporter: NodeId, reported: list[Any]) -> ReportPlan:
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
