"""The catalog manager's report handler: tablet reports judged and written, on the leader.

`report_processing` decides what one report calls for (PURE); `ReportHandler` is the part with
locks and a write: it judges a report against the manager's committed maps, takes the locks of
the tables and tablets the plan changes, judges again under them and replicates the plan's
record changes as ONE write (which may share its sys.catalog entry with the writes of other
reports processed at the same time: group_commit.py). It also keeps which replicas their
servers report FAILED (`rereplication.FailedReplicas`, in memory: not replicated).
`CatalogManager` (catalog_manager.py) holds one and answers NotReady before it delegates;
`heartbeat` reaches it through the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from service.common import failpoints
from service.common.ids import NodeId, TabletId
from service.master.catalog_info import CatalogMaps
from service.master.catalog_records import CatalogWrite, TableState
from service.master.claims import ClaimEvidence, ConfirmClaims
from service.master.report_processing import (
    Answers,
    Claim,
    ReportedTablet,
    ReportPlan,
    plan_report,
)
from service.master.rereplication import FailedReplicas
from service.master.sys_catalog import ApplyResult

__all__ = ["ReportHandler"]


class ReportHandler:
    """Tablet reports of the leader (module docstring).

    It reads the maps through `maps` on every use, and keeps nothing derived from them: the
    manager replaces its maps when it rebuilds them, and a report judged after an await must
    see the current ones. `_failed` is emptied whenever a term starts or ends (`clear`)."""

    def __init__(
        self,
        maps: Callable[[], CatalogMaps],
        replicate: Callable[[CatalogWrite], Awaitable[ApplyResult]],
    ) -> None:
        self._maps = maps
        self._replicate = replicate
        """The manager's: propose one write and wait until it is applied; a refusal is raised
        as its error."""
        self._failed = FailedReplicas()
        self._claims = ClaimEvidence()

    @property
    def failed_replicas(self) -> FailedReplicas:
        """Replicas their servers report FAILED, as this leader heard (read it, never change
        it)."""
        return self._failed

    @property
    def claims(self) -> ClaimEvidence:
        """What servers said of their replicas, and claims waiting for confirmation (read it;
        the handler changes it)."""
        return self._claims

    def clear(self) -> None:
        """A term starts or ends: what servers reported FAILED, and what they said of their
        replicas, is rebuilt by the full reports a new leader asks for."""
        self._failed.clear()
        self._claims.clear()

    def note_replica_states(
        self, reporter: NodeId, reported: Sequence[ReportedTablet], *, full: bool
    ) -> bool:
        """Learn which of `reporter`'s replicas are FAILED, and what it says of each (the
        evidence for other servers' claims, claims.py), from one of its reports; True if a
        replica is newly FAILED (re-replication has work)."""
        self._claims.note_report(reporter, reported, self._maps())
        return self._failed.note_report(reporter, reported, full=full)

    def note_answers(self, answers: Mapping[TabletId, Answers]) -> None:
        """Servers' answers to GetConsensusState about claimed tablets (claims.py)."""
        self._claims.note_answers(answers)

    def claims_to_ask(self, claims: Sequence[Claim]) -> list[Claim]:
        """Which unconfirmed claims to ask their voters about now (claims.py)."""
        return self._claims.to_ask(claims, self._maps(), _now())

    def judge_report(self, reporter: NodeId, reported: Sequence[ReportedTablet]) -> ReportPlan:
        """The report judged against committed state without writing anything
        (`report_processing.plan_report`), with what other servers said of its tablets and
        their pending claims; its own unconfirmed claims become pending."""
        ids = [r.tablet_id for r in reported]
        plan = plan_report(
            self._maps(),
            reporter,
            reported,
            self._claims.answers(ids),
            self._claims.pending(ids),
        )
        if plan.unconfirmed:
            self._claims.note_unconfirmed(plan.unconfirmed, _now())
        return plan

    async def process_report(
        self,
        reporter: NodeId,
        reported: Sequence[ReportedTablet],
        judged: ReportPlan | None = None,
    ) -> ReportPlan:
        """Judge one tablet report against committed state and replicate its record changes
        as ONE write; returns the plan, whose `actions` the caller sends once this returns
        (the write committed). Replication errors propagate and change nothing (KUDU-495):
        the server's next report (not acknowledged) tries again. `judged`: `judge_report`'s
        plan of this report, if the caller has it (it names the tablets to lock; the report
        is judged again under the locks either way)."""
        plan = judged if judged is not None else self.judge_report(reporter, reported)
        if plan.write is None:
            return plan
        tablets = sorted(plan.updated_tablets)
        tables = sorted({self._maps().tablets_by_id[t].table_id for t in tablets})
        async with contextlib.AsyncExitStack() as stack:
            for table_id in tables:
                # An ALTERING table is locked exclusively: the report that ends the alter is
                # judged from every tablet's reported version, so two reports of its tablets
                # must not plan side by side (each saw the other's tablet behind, neither
                # ended the alter, and the table stayed ALTERING: edge-triggered reports do
                # not come again). Kudu takes the table's write lock for the same step.
                table = self._maps().tables_by_id[table_id]
                altering = table.record.state is TableState.ALTERING
                lock = table.lock.exclusive() if altering else table.lock.shared()
                await stack.enter_async_context(lock)
            for tablet_id in tablets:
                await stack.enter_async_context(self._maps().tablets_by_id[tablet_id].lock)
            plan = self.judge_report(reporter, reported)  # again, under the locks
            if plan.write is not None:
                await self._replicate(plan.write)
                self._claims.after_commit(plan, self._maps())
                failpoints.hit("process_report:after_replicate")
        return plan

    async def settle_claims(self, confirm: ConfirmClaims) -> list[ReportPlan]:
        """One sweep of the pending claims (claims.py): ask the voters of those due, then
        process each claimant's claims again as a report of just those replicas, so a claim
        the answers confirm is adopted in its write now. Returns the plans that wrote (their
        actions are the caller's to send).

        Processing a claim again is safe for the reason processing a report sent again is: it
        is judged against the committed state of now (`_older` drops a claim a newer record
        overtook), and it is adopted only on the voters' words of now."""
        claims = self._claims.to_sweep(_now())
        if not claims:
            return []
        answers = await confirm(claims)
        if answers:
            self._claims.note_answers(answers)
        by_reporter: dict[NodeId, list[ReportedTablet]] = {}
        for claim in claims:
            by_reporter.setdefault(claim.reporter, []).append(claim.reported)
        plans = []
        for reporter, reported in by_reporter.items():
            plan = self.judge_report(reporter, reported)
            if plan.write is not None:
                plans.append(await self.process_report(reporter, reported, plan))
        return plans


def _now() -> float:
    """The clock of pending claims: the event loop's (monotonic)."""
    return asyncio.get_running_loop().time()
