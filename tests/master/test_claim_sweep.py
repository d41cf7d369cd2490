"""The claim sweep (service/master/claims.py): a leader's claim that waits for its followers'
word is settled by asking them, off the heartbeat path, without any report coming again."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from service.common.ids import NodeId, TabletId
from service.master import report_handler
from service.master.background_tasks import SWEEP_EVERY_S, BackgroundSettings, BackgroundTasks
from service.master.catalog_records import ConsensusState, TabletState
from service.master.claims import ASK_AFTER_S, SWEEP_TRIES, ClaimEvidence
from service.master.report_processing import (
    Answers,
    Claim,
    Evidence,
    ReportedRole,
    ReportedState,
    ReportedTablet,
    ReportPlan,
)
from service.master.tserver_proxy import Fence
from tests.helpers.catalog_env import Env, create, make_env, run
from tests.helpers.tablet_reports import PEERS, leader_reports

LEADER = ReportedRole.LEADER


class Clock:
    """The claims' clock (`report_handler._now`), moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(report_handler, "_now", c)
    return c


def _claim(tablet: str, reporter: str = "ts-0") -> Claim:
    cs = ConsensusState(1, 0, PEERS, NodeId(reporter))
    return Claim(
        NodeId(reporter),
        ReportedTablet(TabletId(tablet), ReportedState.RUNNING, LEADER, cs, 0),
    )


def test_a_sweep_asks_waiting_claims_oldest_first_a_limit_at_a_time_not_again_soon() -> None:
    ev = ClaimEvidence()
    for i in range(5):
        ev.note_unconfirmed([_claim(f"t{i}")], now=100.0 + i)
    assert ev.to_sweep(100.0 + ASK_AFTER_S - 0.01) == []  # none has waited long enough
    got = ev.to_sweep(104.0 + ASK_AFTER_S, limit=3)
    assert [c.tablet_id for c in got] == ["t0", "t1", "t2"]
    # The rest next; the ones asked are not asked again until ASK_AFTER_S has passed.
    assert [c.tablet_id for c in ev.to_sweep(104.0 + ASK_AFTER_S, limit=3)] == ["t3", "t4"]
    assert ev.to_sweep(104.0 + 2 * ASK_AFTER_S - 0.01) == []
    assert len(ev.to_sweep(104.0 + 2 * ASK_AFTER_S)) == 5
    assert len(ev.to_sweep(104.0 + 3 * ASK_AFTER_S)) == 5
    # Asked SWEEP_TRIES times and never confirmed: dropped, until its claimant reports it again.
    assert ev.to_sweep(104.0 + 4 * ASK_AFTER_S) == [] and ev.pending_claims == 0
    ev.note_unconfirmed([_claim("t0")], now=200.0)
    assert ev.to_sweep(200.0 + ASK_AFTER_S) == [_claim("t0")]
    # Another claim of a tablet starts its own count.
    for k in range(SWEEP_TRIES - 1):
        assert len(ev.to_sweep(200.0 + (k + 2) * ASK_AFTER_S)) == 1
    ev.note_unconfirmed([_claim("t0", reporter="ts-1")], now=200.0 + 5 * ASK_AFTER_S)
    assert ev.to_sweep(200.0 + 6 * ASK_AFTER_S) == [_claim("t0", reporter="ts-1")]
    # A term's end forgets everything.
    ev.clear()
    assert ev.pending_claims == 0 and ev.to_sweep(10_000.0) == []


async def _pending(env: Env) -> tuple[str, NodeId, dict[str, list[ReportedTablet]], ReportPlan]:
    """A new table whose first report is one leader's, processed before any follower reported:
    its claims are pending. Returns the table, that leader, every server's report and the
    leader's report's plan."""
    table_id = await create(env)
    await env.cm.assign_tablets()
    reports = leader_reports(env, table_id)
    leader = NodeId(sorted(u for u in reports if any(t.role is LEADER for t in reports[u]))[0])
    env.cm.note_replica_states(leader, reports[leader], full=True)
    plan = await env.cm.process_report(leader, reports[leader])
    return table_id, leader, reports, plan


def _followers_say(reports: dict[str, list[ReportedTablet]], leader: NodeId) -> Any:
    """A GetConsensusState that answers what each other server's replica holds."""
    asked: list[set[TabletId]] = []

    async def confirm(claims: Sequence[Claim]) -> dict[TabletId, Answers]:
        wanted = {c.tablet_id for c in claims}
        asked.append(wanted)
        out: dict[TabletId, dict[NodeId, Evidence]] = {}
        for uuid, tablets in reports.items():
            for t in tablets:
                if uuid != leader and t.tablet_id in wanted and t.consensus is not None:
                    out.setdefault(t.tablet_id, {})[NodeId(uuid)] = Evidence(t.consensus)
        return dict(out)

    confirm.asked = asked  # type: ignore[attr-defined]
    return confirm


def test_a_pending_claim_is_adopted_by_a_sweep_when_its_voters_confirm_it(clock: Clock) -> None:
    async def main() -> None:
        env = make_env()
        _, leader, reports, plan = await _pending(env)
        claimed = {c.tablet_id for c in plan.unconfirmed}
        assert claimed and plan.write is None
        assert env.cm.pending_claims() == len(claimed)
        confirm = _followers_say(reports, leader)

        clock.now += ASK_AFTER_S - 0.1
        assert await env.cm.settle_claims(confirm) == [] and confirm.asked == []

        clock.now += 0.1
        before = env.raft.proposals
        plans = await env.cm.settle_claims(confirm)
        assert confirm.asked == [claimed]
        assert env.raft.proposals - before == 1  # the claimant's claims: one write
        assert {t for p in plans for t in p.updated_tablets} == claimed
        for t in claimed:
            rec = env.state.tablet(t).record  # type: ignore[union-attr]
            assert rec.state is TabletState.RUNNING
            assert rec.consensus is not None and rec.consensus.leader_uuid == leader
        assert env.cm.pending_claims() == 0
        clock.now += 10 * ASK_AFTER_S
        assert await env.cm.settle_claims(confirm) == [] and len(confirm.asked) == 1

    run(main())


def test_a_claim_its_voters_do_not_confirm_is_asked_a_few_times_then_dropped(
    clock: Clock,
) -> None:
    """The one-server attack of report_processing: a claimant whose voters say nothing (or
    something else) gets nothing from the sweep either, and its claim costs one ask per
    ASK_AFTER_S, SWEEP_TRIES times per report it sends."""

    async def main() -> None:
        env = make_env()
        table_id, leader, reports, _ = await _pending(env)
        asked = []

        async def silent(claims: Sequence[Claim]) -> dict[TabletId, Answers]:
            asked.append(len(claims))
            return {}

        clock.now += ASK_AFTER_S
        before = env.raft.proposals
        assert await env.cm.settle_claims(silent) == []
        assert env.raft.proposals == before and len(asked) == 1
        assert env.cm.pending_claims() > 0
        for row in env.state.tablets_of(table_id):
            assert row.record.state is TabletState.CREATING
        clock.now += ASK_AFTER_S / 2
        await env.cm.settle_claims(silent)
        assert len(asked) == 1
        clock.now += ASK_AFTER_S / 2
        await env.cm.settle_claims(silent)
        assert len(asked) == 2
        for _ in range(3):
            clock.now += ASK_AFTER_S
            await env.cm.settle_claims(silent)
        assert len(asked) == SWEEP_TRIES and env.cm.pending_claims() == 0
        for row in env.state.tablets_of(table_id):
            assert row.record.state is TabletState.CREATING
        # The claimant's next report brings the claim back.
        await env.cm.process_report(leader, reports[leader])
        assert env.cm.pending_claims() > 0

    run(main())


class _NoRpcs:
    """A proxy the sweep test never calls (no task is due)."""

    rpc_timeout_s = 10.0

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected proxy call {name}")


def test_the_background_round_sweeps_pending_claims_at_most_once_a_second(clock: Clock) -> None:
    async def main() -> None:
        env = make_env()
        _, leader, reports, _ = await _pending(env)
        claimed = env.cm.pending_claims()
        asked = []

        async def silent(claims: Sequence[Claim]) -> dict[TabletId, Answers]:
            asked.append(len(claims))
            return {}

        bg = BackgroundTasks(
            env.cm,
            env.ts,
            _NoRpcs(),  # type: ignore[arg-type]
            Fence("master-1", 1),
            env.clock,
            random.Random(1),
            BackgroundSettings(),
            confirm_claims=silent,
        )
        bg._start_tasks = lambda: None  # type: ignore[method-assign]  # the CreateTablet calls
        clock.now += ASK_AFTER_S
        await bg.round()
        first = bg._sweep
        assert first is not None
        await first
        assert asked == [claimed] and bg.claims_adopted == 0
        await bg.round()  # rounds come as often as commits wake them; sweeps do not
        assert bg._sweep is first
        env.clock.advance(SWEEP_EVERY_S)
        clock.now += ASK_AFTER_S
        bg.confirm_claims = _followers_say(reports, leader)
        await bg.round()
        assert bg._sweep is not first and bg._sweep is not None
        await bg._sweep
        assert bg.claims_adopted == claimed and env.cm.pending_claims() == 0
        await bg.aclose()

    run(main())


def test_the_sweep_runs_only_with_a_confirm_and_pending_claims() -> None:
    async def main() -> None:
        env = make_env()
        bg = BackgroundTasks(
            env.cm,
            env.ts,
            _NoRpcs(),
            Fence("m", 1),
            env.clock,
            random.Random(1),  # type: ignore[arg-type]
        )
        await bg.round()
        assert bg._sweep is None
        bg.confirm_claims = _followers_say({}, NodeId("x"))
        await bg.round()
        assert bg._sweep is None  # nothing pending: no task
        await bg.aclose()

    asyncio.run(main())
