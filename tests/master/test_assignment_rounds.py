"""Bounded assignment rounds and the placement backoff (catalog_assignment, "Bounded rounds" and
"Backoff"; the starvation spiral, docs/design/failover.md#R8): a huge CreateTable is placed in
rounds of at most `max_tablets_per_assignment_round` tablets, each ONE write, planned in chunks with
the event loop free in between; a table that cannot be placed waits out a doubling pause instead of
being tried (and logged) every round; and a queued CreateTablet whose task committed state no
longer calls for is never sent.

Runs in-process on `FakeRaft` (tests/helpers/catalog_env.py) and a manual clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter
from typing import Any

from service.common.ids import NodeId
from service.master.catalog_assignment import CreateReplicas
from service.master.catalog_records import CatalogWrite, TabletState, Update
from service.master.placement_policy import ServerLoad, TablePlacer, place_table
from service.master.ts_descriptor import NodeInstance
from service.master.tserver_proxy import Fence
from tests.helpers.assignment import ROUND, background, bounded_env, hashed, heartbeat_all
from tests.helpers.catalog_env import (
    UNRESPONSIVE_S,
    Env,
    Ids,
    by_id,
    create,
    run,
    wait_for,
)


def replicas_per_server(env: Env, table_id: str) -> dict[str, int]:
    return {u: env.ts.replica_counts(u).get(table_id, 0) for u in sorted(env.ts.uuids())}


def test_a_huge_create_is_placed_in_bounded_rounds_of_one_write_each() -> None:
    env = bounded_env(servers=5)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(250))
        writes = len(env.raft.log)
        sizes = []
        while env.cm.assignment_due():
            plan = await env.cm.assign_tablets()
            sizes.append(len(plan.assigned))
        assert sizes == [100, 100, 50]
        assert len(env.raft.log) == writes + 3  # one write per round
        states = Counter(t.state for t in env.cm.maps.tables_by_id[table_id].live_tablets())
        assert states == {TabletState.CREATING: 250}
        # Later rounds count the replicas placed by earlier ones: as even as one round.
        assert set(replicas_per_server(env, table_id).values()) == {150}

    run(go())


def test_a_round_yields_to_the_event_loop_between_planning_chunks() -> None:
    env = bounded_env(servers=3)

    async def go() -> None:
        await create(env, partition_schema=hashed(ROUND))
        ticks = 0
        stop = False

        async def other_work() -> None:  # what heartbeats would be doing
            nonlocal ticks
            while not stop:
                ticks += 1
                await asyncio.sleep(0)

        worker = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        before = ticks
        plan = await env.cm.assign_tablets()
        stop = True
        await worker
        assert len(plan.assigned) == ROUND
        # 100 tablets in chunks of 32: the loop ran other work between the 4 chunks.
        assert ticks - before >= 3

    run(go())


def test_chunked_placement_makes_exactly_the_choices_of_one_call() -> None:
    servers = [ServerLoad(f"ts-{i:02}", True, i % 3, {}) for i in range(12)]
    whole = place_table(servers, "t1", 40, 3, random.Random(7))
    placer = TablePlacer(servers, "t1", 3)
    rng = random.Random(7)
    chunked = [*placer.place(1, rng), *placer.place(13, rng), *placer.place(26, rng)]
    assert chunked == whole


def test_an_unplaceable_table_waits_out_a_doubling_backoff() -> None:
    env = bounded_env(servers=3, assignment_retry_initial_s=1.0, assignment_retry_max_s=4.0)
    clock = env.clock

    async def go() -> None:
        table_id = await create(env)
        clock.advance(UNRESPONSIVE_S + 1)  # every server dead: nothing can be placed
        pauses = []
        for attempt in range(1, 5):
            assert env.cm.assignment_due()
            writes = len(env.raft.log)
            plan = await env.cm.assign_tablets()
            assert plan.empty and len(env.raft.log) == writes  # nothing replicated
            (d,) = plan.deferred  # one warning per attempt, for the whole table
            assert d.table_id == table_id and d.tablets == 6 and d.attempts == attempt
            assert "need 3 live tablet servers, have 0" in d.reason
            pauses.append(d.retry_in_s)
            assert not env.cm.assignment_due()  # waiting: no round until the pause is over
            assert env.cm.next_assignment_at() == clock.monotonic() + d.retry_in_s
            clock.advance(d.retry_in_s)
        assert pauses == [1.0, 2.0, 4.0, 4.0]  # doubling, capped
        heartbeat_all(env)  # the servers come back
        plan = await env.cm.assign_tablets()
        assert len(plan.assigned) == 6 and not plan.deferred
        assert env.cm.next_assignment_at() is None  # no backoff; no CreateTablet sent yet
        assert not env.cm.assignment_due()

    run(go())


def lose_two_of_five(env: Env) -> None:
    """ts-3 and ts-4 go silent past the unresponsive timeout; the other three stay live."""
    env.clock.advance(UNRESPONSIVE_S + 1)
    for u in ("ts-0", "ts-1", "ts-2"):
        env.ts.heartbeat(NodeInstance(NodeId(u), 1))


def test_a_deferred_table_does_not_hold_back_other_tables() -> None:
    env = bounded_env(servers=5)

    async def go() -> None:
        wide = await create(env, "wide", num_replicas=5)
        lose_two_of_five(env)  # 5 replicas, 3 live servers
        plan = await env.cm.assign_tablets()
        assert [d.table_id for d in plan.deferred] == [wide]
        narrow = await create(env, "narrow")
        assert env.cm.assignment_due()  # the new table is not waiting
        plan = await env.cm.assign_tablets()
        assigned = {env.cm.maps.tablets_by_id[t].table_id for t in plan.assigned}
        assert assigned == {narrow} and not plan.deferred  # "wide" was not even tried

    run(go())


def test_a_new_leader_tries_every_table_at_once() -> None:
    env = bounded_env(servers=5)

    async def go() -> None:
        await create(env, "wide", num_replicas=5)
        lose_two_of_five(env)
        plan = await env.cm.assign_tablets()
        assert len(plan.deferred) == 1
        assert not env.cm.assignment_due()
        env.cm.unload()  # deposed, then elected again: backoffs are one leader's soft state
        env.cm.load()
        assert env.cm.assignment_due()

    run(go())


# --- the background loop -----------------------------------------------------------------------


class RecordingProxy:
    """Answers CreateTablet at once and records which tablets it was asked to create."""

    def __init__(self) -> None:
        self.created: list[tuple[str, str]] = []
        self.gate = asyncio.Event()
        self.calls = 0

    async def create_tablet(
        self, address: str, dest: str, fence: Fence, tablet: Any, table: Any, **_: Any
    ) -> None:
        self.calls += 1
        await self.gate.wait()
        self.created.append((tablet.tablet_id, dest))


def test_a_round_that_leaves_tablets_due_wakes_the_loop_for_the_next_one() -> None:
    env = bounded_env(servers=3)

    async def go() -> None:
        await create(env, partition_schema=hashed(ROUND + 1))
        proxy = RecordingProxy()
        proxy.gate.set()
        bg = background(env, proxy)
        await bg.round()
        assert bg._wake.is_set()  # one tablet still PREPARING: the next round follows at once
        bg._wake.clear()
        await bg.round()
        assert not env.cm.assignment_due() and not bg._wake.is_set()
        while bg.in_flight:
            await asyncio.sleep(0)
        await bg.aclose()

    run(go())


def test_queued_create_tablets_of_a_deleted_table_are_never_sent() -> None:
    env = bounded_env(servers=3)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(8))
        proxy = RecordingProxy()
        bg = background(env, proxy, max_rpcs=2)
        # 8 tablets placed: 8 tasks of 3 CreateTablets each. 2 tasks run (max_rpcs), their
        # 6 calls share 2 RPC slots; the other 6 tasks wait in the queue.
        await bg.round()
        assert sum(isinstance(t, CreateReplicas) for t in env.cm.pending_tasks()) == 8
        await wait_for(lambda: proxy.calls == 2)
        assert bg.in_flight == 2
        assert bg.num_tasks() == len(bg.views()) == 8  # what /metrics counts, unbuilt
        await env.cm.delete_table(by_id(table_id), Ids()())
        proxy.gate.set()
        while bg.in_flight:
            await asyncio.sleep(0)
        assert len(proxy.created) == 2  # the two already in flight
        assert bg.rpcs_skipped == 4  # the running tasks' other calls
        assert proxy.calls == 2  # the queued tasks never started
        assert not any(isinstance(t, CreateReplicas) for t in env.cm.pending_tasks())
        await bg.aclose()

    run(go())


def test_only_so_many_tablets_are_creating_at_once_and_their_timeout_runs_from_the_send() -> None:
    """Creation in step with capacity (catalog_assignment): at most max_creating_tablets are
    CREATING, and a CREATING tablet is replaced only once its CreateTablet calls have been
    out for the assignment timeout, however long they waited to be sent."""
    env = bounded_env(servers=3, max_creating_tablets=150, assignment_timeout_s=5.0)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(400))
        plan = await env.cm.assign_tablets()
        assert len(plan.assigned) == ROUND
        plan = await env.cm.assign_tablets()
        assert len(plan.assigned) == 50  # room for 150 CREATING
        assert not env.cm.assignment_due()
        env.clock.advance(60.0)  # calls still queued: nothing times out
        heartbeat_all(env)
        assert not env.cm.assignment_due() and (await env.cm.assign_tablets()).empty
        creating = sorted(
            t.tablet_id
            for t in env.cm.maps.tables_by_id[table_id].live_tablets()
            if t.state is TabletState.CREATING
        )
        for tablet_id in creating[:10]:
            env.cm.create_started(tablet_id)
        env.clock.advance(5.0)
        heartbeat_all(env)
        plan = await env.cm.assign_tablets()
        assert sorted(r.old for r in plan.replaced) == creating[:10]

    run(go())


def report_some_running(env: Env, table_id: str, n: int) -> None:
    """`n` of the table's CREATING tablets reported RUNNING by their first peer (one write)."""
    ops = []
    for row in env.state.tablets_of(table_id):
        rec = row.record
        if rec.state is TabletState.CREATING and len(ops) < n:
            assert rec.consensus is not None
            cs = dataclasses.replace(rec.consensus, term=1, leader_uuid=rec.consensus.peers[0].uuid)
            ops.append(Update(dataclasses.replace(rec, state=TabletState.RUNNING, consensus=cs)))
    assert len(ops) == n
    result = env.raft.apply(CatalogWrite(ops=tuple(ops), operation="TabletReport").encode())
    assert result.ok, result.refusal


def test_a_round_waits_for_a_quantum_of_room_not_for_every_freed_tablet() -> None:
    """Once max_creating_tablets are CREATING, a round is due when a quarter of a round's worth
    of room is free (here 10), or room for every tablet still waiting: not for each tablet
    that becomes RUNNING (a round per report cost half the master's CPU)."""
    env = bounded_env(servers=3, max_creating_tablets=40)

    async def go() -> None:
        table_id = await create(env, partition_schema=hashed(55))
        assert len((await env.cm.assign_tablets()).assigned) == 40
        assert not env.cm.assignment_due()
        report_some_running(env, table_id, 9)
        assert not env.cm.assignment_due()  # room 9: less than the quantum
        report_some_running(env, table_id, 1)
        assert env.cm.assignment_due()
        assert len((await env.cm.assign_tablets()).assigned) == 10
        report_some_running(env, table_id, 5)
        assert env.cm.assignment_due()  # room 5 for the last 5: all of them fit
        assert len((await env.cm.assign_tablets()).assigned) == 5
        assert not env.cm.assignment_due()

    run(go())
