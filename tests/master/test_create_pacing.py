"""Creation under overload (create_pacing, docs/design/catalog.md#R16): per-server windows of
CreateTablet calls that adapt to the server's answers, and replacement only of tablets that
are truly stuck, within budgets.

Runs in-process on `FakeRaft` (tests/helpers/catalog_env.py) and a manual clock; the
same on real processes with a slow CreateTablet is tests/integration/test_create_overload.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from service.common.errors import ResourceExhausted
from service.common.ids import NodeId
from service.master.catalog_records import TabletState
from service.master.create_pacing import CreatePacer, Outcome, ReplacementRules
from service.master.tserver_proxy import Fence
from tests.helpers.assignment import background, bounded_env, hashed, heartbeat_all
from tests.helpers.catalog_env import Env, create, run, wait_for

# --- the window -------------------------------------------------------------------------------


def test_the_window_opens_on_prompt_answers_and_halves_on_busy_or_slow_ones() -> None:
    p = CreatePacer(initial_window=8, max_window=12, latency_target_s=1.0)
    s = NodeId("ts-1")
    for _ in range(8):
        p.start(s)
    assert not p.has_room([s])  # eight in flight: the window is full
    for _ in range(8):
        p.finish(s, Outcome.OK, 0.1, now=0.0)
    assert 8.9 < p.servers[s].window < 9.1  # +1/window per answer: about one per window
    p.start(s)
    p.finish(s, Outcome.SHED, 0.01, now=10.0)
    assert 4.4 < p.servers[s].window < 4.6
    # A burst of refusals from one full queue is one signal, not five halvings.
    for _ in range(5):
        p.start(s)
        p.finish(s, Outcome.SHED, 0.01, now=10.01)
    assert 4.4 < p.servers[s].window < 4.6
    p.start(s)
    p.finish(s, Outcome.OK, 3.0, now=20.0)  # answered, but slower than the target
    assert 2.2 < p.servers[s].window < 2.3
    for i in range(10):
        p.start(s)
        p.finish(s, Outcome.TIMEOUT, 30.0, now=100.0 + 100 * i)
    assert p.servers[s].window == 1.0  # never below one call
    assert p.has_room([s])
    # Errors of other kinds say nothing about load.
    p.start(s)
    p.finish(s, Outcome.FAILED, 0.0, now=2000.0)
    assert p.servers[s].window == 1.0 and p.servers[s].failed == 1


def test_the_deadline_grows_with_the_servers_latency_within_bounds() -> None:
    p = CreatePacer(min_deadline_s=10.0, max_deadline_s=60.0, deadline_factor=4.0)
    s = NodeId("ts-1")
    assert p.start(s) == 10.0  # nothing known: the floor
    p.finish(s, Outcome.OK, 5.0, now=0.0)
    assert p.start(s) == 20.0  # 4 x 5 s
    p.finish(s, Outcome.TIMEOUT, 200.0, now=100.0)
    assert p.deadline_s(s) == 60.0  # the ceiling
    p.release(s)
    assert p.servers[s].in_flight == 0


# --- which tablets are replaced -----------------------------------------------------------------


def _creating(env: Env, table_id: str) -> list[str]:
    return sorted(
        t.tablet_id
        for t in env.cm.maps.tables_by_id[table_id].live_tablets()
        if t.state is TabletState.CREATING
    )


def test_a_tablet_whose_replicas_answer_is_not_replaced_while_they_do() -> None:
    env = bounded_env(servers=3, assignment_timeout_s=5.0)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(4))
        await env.cm.assign_tablets()
        a, b, c, d = _creating(env, table_id)
        for t in (a, b, c, d):
            env.cm.create_started(t)
        peers = {
            t: [p.uuid for p in env.cm.maps.tablets_by_id[t].record.consensus.peers]  # type: ignore[union-attr]
            for t in (a, b, c, d)
        }
        # a: one replica answers every 4 s (progress); b: its servers refuse as busy (alive,
        # progress too); c: two of three answered, then silence; d: nothing at all.
        env.cm.creation_progress(c, peers[c][0], True)
        env.cm.creation_progress(c, peers[c][1], True)
        for step in range(5):
            env.clock.advance(4.0)
            heartbeat_all(env)
            env.cm.creation_progress(a, peers[a][step % 3], True)
            env.cm.creation_progress(b, peers[b][0], False)
            plan = await env.cm.assign_tablets() if env.cm.assignment_due() else None
            if step == 1:  # d: 8 s without progress, past the 5 s timeout
                assert plan is not None and [r.old for r in plan.replaced] == [d]
            else:
                assert plan is None or not plan.replaced, plan
        # c: a majority answered, so it waits ten timeouts without progress (50 s) for a
        # leader; a and b go on progressing and are never replaced.
        silent = 20.0
        replaced: list[str] = []
        while not replaced:
            env.clock.advance(1.0)
            silent += 1.0
            heartbeat_all(env)
            env.cm.creation_progress(a, peers[a][0], True)
            env.cm.creation_progress(b, peers[b][0], False)
            if env.cm.assignment_due():
                plan = await env.cm.assign_tablets()
                replaced = [r.old for r in plan.replaced]
        assert replaced == [c] and silent == 50.0
        assert env.cm.assigner.replaced == {"no answer": 1, "no leader": 1}

    run(go())


def test_a_tablet_whose_calls_wait_for_a_window_or_are_in_flight_is_not_replaced() -> None:
    env = bounded_env(servers=3, assignment_timeout_s=5.0)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(2))
        await env.cm.assign_tablets()
        a, b = _creating(env, table_id)
        first = env.cm.maps.tablets_by_id[a].record.consensus.peers[0].uuid  # type: ignore[union-attr]
        env.cm.create_started(a)
        env.cm.create_started(b)
        # a: one replica answered, the others refused as busy; its calls wait for windows.
        env.cm.creation_progress(a, first, True)
        env.cm.creation_paused(a)
        # b: a call is out, its deadline past the assignment timeout.
        env.cm.creation_call(b, True, env.clock.monotonic() + 60.0)
        for _ in range(30):
            env.clock.advance(1.0)
            heartbeat_all(env)
            env.cm.creation_progress(a, first, True)  # its replica's reports: not a timer
            assert not env.cm.assignment_due()
        env.cm.creation_call(b, False)  # the call timed out: no progress, b is replaced
        env.clock.advance(31.0)
        heartbeat_all(env)
        assert [r.old for r in (await env.cm.assign_tablets()).replaced] == [b]
        env.cm.create_started(a)  # a's calls go out again: its timer runs from now
        env.clock.advance(4.0)
        heartbeat_all(env)
        assert not env.cm.assignment_due() or not (await env.cm.assign_tablets()).replaced
        env.clock.advance(1.0)
        heartbeat_all(env)
        assert a in [r.old for r in (await env.cm.assign_tablets()).replaced]

    run(go())


def test_a_partition_replaced_before_waits_twice_as_long_each_time() -> None:
    env = bounded_env(servers=3, assignment_timeout_s=5.0)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(2))
        await env.cm.assign_tablets()
        keep = _creating(env, table_id)[1]  # the other partition: created, its record stays
        waits = []
        for _ in range(5):
            await env.cm.assign_tablets()  # place the (new) PREPARING tablet
            (t,) = [x for x in _creating(env, table_id) if x != keep]
            env.cm.create_started(t)
            waited = 0.0
            while not env.cm.assignment_due():
                env.clock.advance(1.0)
                heartbeat_all(env)
                waited += 1.0
            waits.append(waited)
            plan = await env.cm.assign_tablets()
            assert [r.old for r in plan.replaced] == [t]
        assert waits == [5.0, 10.0, 20.0, 40.0, 40.0]  # doubling, capped at 8 timeouts

    run(go())


def test_replacements_in_flight_are_bounded_and_the_rest_wait() -> None:
    env = bounded_env(
        servers=3,
        assignment_timeout_s=5.0,
        max_replacements_in_flight=4,
        max_replacements_per_ts=100,
    )

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(10))
        await env.cm.assign_tablets()
        for t in _creating(env, table_id):
            env.cm.create_started(t)
        env.clock.advance(5.0)
        heartbeat_all(env)
        plan = await env.cm.assign_tablets()
        assert len(plan.replaced) == 4  # the budget; six wait
        assert env.cm.assigner.postponed == 6
        assert len((await env.cm.assign_tablets()).assigned) == 4  # the replacements placed
        assert not env.cm.assignment_due()  # the six postponed, not spinning
        env.clock.advance(2.0)
        heartbeat_all(env)
        plan = await env.cm.assign_tablets()
        # Due again, but the four replacements are still not RUNNING: nothing more.
        assert not plan.replaced
        rules = ReplacementRules(1.0, max_in_flight=100, max_in_flight_per_ts=2)
        infos = [env.cm.maps.tablets_by_id[t] for t in _creating(env, table_id)]
        now, wait = rules.admit(env.cm.maps, infos)
        assert now == [] and len(wait) == len(infos)  # every server has four already

    run(go())


# --- the background tasks ------------------------------------------------------------------------


class BusyProxy:
    """A tablet server that takes `capacity` CreateTablet calls at a time and refuses the rest
    with RESOURCE_EXHAUSTED, answering each after the test releases it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.inside: dict[str, int] = {}
        self.shed = 0
        self.created: set[tuple[str, str]] = set()
        self.release = asyncio.Event()
        self.rpc_timeout_s = 10.0

    async def create_tablet(
        self, address: str, dest: str, fence: Fence, tablet: Any, table: Any, **_: Any
    ) -> None:
        if self.inside.get(dest, 0) >= self.capacity:
            self.shed += 1
            raise ResourceExhausted("busy")
        self.inside[dest] = self.inside.get(dest, 0) + 1
        try:
            await self.release.wait()
            self.created.add((tablet.tablet_id, dest))
        finally:
            self.inside[dest] -= 1


def test_busy_servers_shrink_their_window_and_every_tablet_is_created_without_a_failure() -> None:
    env = bounded_env(servers=3, assignment_timeout_s=5.0)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(30))
        proxy = BusyProxy(capacity=2)
        bg = background(env, proxy)
        await bg.round()
        await wait_for(lambda: proxy.shed > 0)
        windows = {s: w.window for s, w in bg.pacer.views()}
        assert all(w < 8 for w in windows.values()), windows  # halved on the refusals
        proxy.release.set()
        for _ in range(200):
            env.clock.advance(0.5)
            heartbeat_all(env)
            await bg.round()
            await asyncio.sleep(0.01)
            if len(proxy.created) == 90:
                break
        assert len(proxy.created) == 90  # 30 tablets x 3 replicas
        assert bg.rpcs_failed == 0 and bg.rpcs_shed == proxy.shed > 0
        assert not (await env.cm.assign_tablets()).replaced
        assert len(_creating(env, table_id)) == 30  # all created, none replaced
        await bg.aclose()

    run(go())
