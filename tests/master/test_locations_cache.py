"""The table locations cache (`service/master/locations_cache.py`) as the catalog manager uses
it, and the servicer's response memo built on it.

The property that matters: a cached answer is never stale. `test_cached_answers_always_equal_
fresh_ones` checks it against answers computed without the cache, through a seeded random walk
of everything that changes locations (leader changes, replica moves, servers re-registering at
new addresses, renames, deletes, a new table under an old name, a new leader's reload).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from service.common.errors import NotFound
from service.common.ids import NodeId, TableId
from service.master.catalog_info import ReplicaRole
from service.master.catalog_reads import TableLocations, table_locations
from service.master.catalog_records import (
    CatalogWrite,
    HostPort,
    RequestId,
    TabletState,
    Update,
)
from service.master.catalog_settings import CatalogSettings
from service.master.master_service import _LocationsResponses
from service.master.ts_descriptor import NodeInstance, TSRegistration
from tests.helpers.catalog_env import (
    Env,
    by_id,
    by_name,
    create_running,
    make_env,
    run,
)


def _move_leader(env: Env, table_id: str, rng: random.Random) -> None:
    """One tablet's leadership moves to another of its peers (a report, committed)."""
    rows = [r for r in env.state.tablets_of(table_id) if r.record.state is TabletState.RUNNING]
    rec = rng.choice(rows).record
    assert rec.consensus is not None
    others = [p.uuid for p in rec.consensus.peers if p.uuid != rec.consensus.leader_uuid]
    cs = dataclasses.replace(
        rec.consensus, term=rec.consensus.term + 1, leader_uuid=rng.choice(others)
    )
    write = CatalogWrite(ops=(Update(dataclasses.replace(rec, consensus=cs)),), operation="r")
    assert env.raft.apply(write.encode()).ok


def _reregister(env: Env, uuid: str, address: str, seqno: int) -> None:
    env.ts.register(NodeInstance(NodeId(uuid), seqno), TSRegistration((address,)))


def _leaders(locations: TableLocations) -> list[str]:
    return [
        next(r.ts_uuid for r in t.replicas if r.role is ReplicaRole.LEADER)
        for t in locations.tablets
    ]


def _fresh(env: Env, table: object, start: bytes, end: bytes, limit: int) -> TableLocations:
    """The answer computed now, without the cache."""
    info = env.cm._resolve(table)
    ttl = env.cm.settings.table_locations_ttl_ms
    return table_locations(info, start, end, limit, ttl, env.cm._address_of)


def test_a_repeated_lookup_returns_the_same_answer_until_a_tablet_changes() -> None:
    env = make_env(servers=3)

    async def go() -> None:
        table_id = await create_running(env)
        first = await env.cm.get_table_locations(by_id(table_id), max_tablets=100)
        assert await env.cm.get_table_locations(by_id(table_id), max_tablets=100) is first
        # Another range or limit is another entry.
        other = await env.cm.get_table_locations(by_id(table_id), max_tablets=2)
        assert other is not first and len(other.tablets) == 2

        _move_leader(env, table_id, random.Random(1))
        after = await env.cm.get_table_locations(by_id(table_id), max_tablets=100)
        assert after is not first
        assert after == _fresh(env, by_id(table_id), b"", b"", 100)
        assert _leaders(after) != _leaders(first)

    run(go())


def test_a_server_registering_at_a_new_address_is_seen_and_a_heartbeat_is_not() -> None:
    env = make_env(servers=3)

    async def go() -> None:
        table_id = await create_running(env)
        first = await env.cm.get_table_locations(by_id(table_id))
        version = env.ts.addresses_version
        _reregister(env, "ts-0", "10.0.0.1:7050", 1)  # a retried registration: same address
        assert env.ts.addresses_version == version
        assert await env.cm.get_table_locations(by_id(table_id)) is first

        _reregister(env, "ts-0", "10.9.9.9:7777", 2)  # restarted elsewhere
        assert env.ts.addresses_version == version + 1
        moved = await env.cm.get_table_locations(by_id(table_id))
        assert moved is not first
        ts0 = {r.address for t in moved.tablets for r in t.replicas if r.ts_uuid == "ts-0"}
        assert ts0 == {HostPort("10.9.9.9", 7777)}

    run(go())


def test_renamed_deleted_and_recreated_tables_are_never_answered_from_the_cache() -> None:
    env = make_env(servers=3)

    async def go() -> None:
        old_id = await create_running(env, "metrics")
        by_old_name = await env.cm.get_table_locations(by_name("metrics"))
        assert by_old_name.table_id == old_id

        await env.cm.alter_table(by_id(old_id), [], RequestId("c", 7), new_name="renamed")
        with pytest.raises(NotFound, match="metrics"):
            await env.cm.get_table_locations(by_name("metrics"))
        renamed = await env.cm.get_table_locations(by_name("renamed"))
        assert renamed.table_id == old_id

        new_id = await create_running(env, "metrics", req=RequestId("c", 9))
        again = await env.cm.get_table_locations(by_name("metrics"))
        assert again.table_id == new_id != old_id

        await env.cm.delete_table(by_id(new_id), RequestId("c", 10))
        with pytest.raises(NotFound):
            await env.cm.get_table_locations(by_id(new_id))
        with pytest.raises(NotFound):
            await env.cm.get_table_locations(by_name("metrics"))

    run(go())


def test_a_new_leader_starts_with_an_empty_cache() -> None:
    env = make_env(servers=3)

    async def go() -> None:
        table_id = await create_running(env)
        first = await env.cm.get_table_locations(by_id(table_id))
        assert len(env.cm._locations_cache) == 1
        env.cm.unload()
        assert len(env.cm._locations_cache) == 0
        env.cm.load()
        again = await env.cm.get_table_locations(by_id(table_id))
        assert again is not first and again == first

    run(go())


def test_the_cache_keeps_at_most_its_capacity_and_zero_turns_it_off() -> None:
    env = make_env(servers=3, settings=CatalogSettings(table_locations_cache_entries=2))

    async def go() -> None:
        t = by_id(await create_running(env))
        one = await env.cm.get_table_locations(t, max_tablets=1)
        two = await env.cm.get_table_locations(t, max_tablets=2)
        assert await env.cm.get_table_locations(t, max_tablets=1) is one  # one is now newest
        await env.cm.get_table_locations(t, max_tablets=3)  # evicts two, the least recent
        assert len(env.cm._locations_cache) == 2
        assert await env.cm.get_table_locations(t, max_tablets=1) is one
        assert await env.cm.get_table_locations(t, max_tablets=2) is not two

    run(go())

    off = make_env(servers=3, settings=CatalogSettings(table_locations_cache_entries=0))

    async def go_off() -> None:
        t = by_id(await create_running(off))
        first = await off.cm.get_table_locations(t)
        assert await off.cm.get_table_locations(t) is not first
        assert len(off.cm._locations_cache) == 0

    run(go_off())


def test_answers_for_long_partition_keys_are_not_kept() -> None:
    env = make_env(servers=3)

    async def go() -> None:
        t = by_id(await create_running(env))
        long_key = b"\xff" * 1025
        first = await env.cm.get_table_locations(t, long_key)
        assert await env.cm.get_table_locations(t, long_key) is not first
        assert len(env.cm.locations_cache) == 0
        short = await env.cm.get_table_locations(t, long_key[:1024])
        assert await env.cm.get_table_locations(t, long_key[:1024]) is short

    run(go())


@pytest.mark.parametrize("seed", range(8))
def test_cached_answers_always_equal_fresh_ones(seed: int) -> None:
    rng = random.Random(seed)
    env = make_env(servers=5, settings=CatalogSettings(table_locations_cache_entries=8))

    async def go() -> None:
        names = {await create_running(env, "a"): "a", await create_running(env, "b"): "b"}
        seq = 100
        seqnos = {f"ts-{i}": 1 for i in range(5)}
        for _ in range(300):
            step = rng.random()
            live = [t for t in names if not env.cm.maps.tables_by_id[TableId(t)].is_removed]
            if step < 0.25 and live:
                _move_leader(env, rng.choice(live), rng)
            elif step < 0.4:
                uuid = rng.choice(sorted(seqnos))
                seqnos[uuid] += rng.choice((0, 1))  # a retry, or a restart
                _reregister(env, uuid, f"10.1.{rng.randrange(3)}.{uuid[3:]}:7050", seqnos[uuid])
            elif step < 0.45 and live:
                seq += 1
                t = rng.choice(live)
                names[t] = f"{names[t]}x"
                await env.cm.alter_table(by_id(t), [], RequestId("c", seq), new_name=names[t])
            elif step < 0.48 and live:
                seq += 1
                await env.cm.delete_table(by_id(rng.choice(live)), RequestId("c", seq))
            elif step < 0.5:
                seq += 1
                name = rng.choice(["a", "b", "c"])
                if all(names[t] != name for t in live):
                    names[await create_running(env, name, req=RequestId("c", seq))] = name
            elif step < 0.52:
                env.cm.unload()
                env.cm.load()
            for _ in range(3):  # lookups, by id or by name, over a few ranges and limits
                t = rng.choice(sorted(names))
                table = by_id(t) if rng.random() < 0.5 else by_name(names[t])
                start = rng.choice([b"", bytes([rng.randrange(256)])])
                limit = rng.choice([0, 1, 3, 100])
                try:
                    got = await env.cm.get_table_locations(table, start, b"", limit)
                except NotFound:
                    with pytest.raises(NotFound):
                        env.cm._resolve(table)
                    continue
                want = _fresh(env, table, start, b"", limit or 10)
                assert got == want

    run(go())


def test_the_servicer_builds_one_response_per_answer_and_keeps_a_bounded_number() -> None:
    env = make_env(servers=3)

    async def answers() -> list[TableLocations]:
        t = by_id(await create_running(env))  # 6 tablets
        return [await env.cm.get_table_locations(t, max_tablets=n) for n in (6, 2, 1)]

    six, two, one = run(answers())
    memo = _LocationsResponses(max_tablets=8)
    r6 = memo.response(six)
    assert memo.response(six) is r6
    assert [t.tablet_id for t in r6.tablet_locations] == [t.tablet_id for t in six.tablets]
    assert r6.table_id == six.table_id and r6.ttl_ms == six.ttl_ms
    # An equal but distinct answer (rebuilt after a change) gets its own message.
    assert memo.response(dataclasses.replace(six)) is not r6
    r2 = memo.response(two)  # 6 + 6 + 2 tablets > 8: the oldest go first
    assert memo.response(two) is r2
    assert memo.response(six) is not r6
    r1 = memo.response(one)
    assert memo.response(one) is r1
