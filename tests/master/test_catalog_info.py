"""The in-memory catalog (docs/design/catalog.md#R3, #R10): copy-on-write infos, the maps kept by
`on_applied` equal to the maps rebuilt from sys.catalog, the partition index behind
GetTableLocations, locations from committed consensus state (no replica cache: KUDU-1353), and the
side-effect tasks derived from committed records."""

from __future__ import annotations

import collections
import dataclasses
import random

import pytest

from service.common import errors
from service.common.clock import ManualClock
from service.common.errors import NotFound
from service.common.ids import NodeId, TableId, TabletId
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.master.catalog_assignment import (
    AlterReplicas,
    CreateReplicas,
    DeleteReplicas,
    PendingTasks,
    tasks_for,
)
from service.master.catalog_info import (
    CatalogMaps,
    PartitionIndex,
    ReplicaRole,
    TabletInfo,
)
from service.master.catalog_reads import (
    TableIdentifier,
    TabletNotRunning,
    registry_address_of,
    resolve_table,
    table_locations,
    tablet_locations,
)
from service.master.catalog_records import (
    CatalogWrite,
    ConsensusState,
    HostPort,
    Insert,
    MemberType,
    RaftPeer,
    TableRecord,
    TableState,
    TabletRecord,
    TabletState,
    Update,
)
from service.master.sys_catalog import ApplyResult, Row, SysCatalogState
from service.master.ts_descriptor import NodeInstance, TSRegistration
from service.master.ts_manager import TSManager

SCHEMA = Schema.build([("k", ColumnType.STRING), ("v", ColumnType.INT64)], "k")
T0 = 1_700_000_000_000_000


class Ids:
    def __init__(self, seed: int = 3) -> None:
        self.rng = random.Random(seed)

    def __call__(self) -> str:
        return f"{self.rng.getrandbits(128):032x}"


def table_record(table_id: str, name: str, ps: PartitionSchema | None = None) -> TableRecord:
    return TableRecord(
        table_id=TableId(table_id),
        name=name,
        schema=SCHEMA,
        partition_schema=ps or PartitionSchema(split_rows=(("g",), ("p",))),
        state=TableState.RUNNING,
        num_replicas=3,
        created_time_us=T0,
    )


def tablet_records(table: TableRecord, ids: Ids) -> list[TabletRecord]:
    return [
        TabletRecord(TabletId(ids()), table.table_id, p, TabletState.PREPARING)
        for p in table.partition_schema.create_partitions(table.schema)
    ]


def consensus(
    servers: list[str], *, leader: str | None = None, learners: tuple[str, ...] = ()
) -> ConsensusState:
    peers = [RaftPeer(NodeId(u), MemberType.VOTER, HostPort(f"{u}.example", 7050)) for u in servers]
    peers += [RaftPeer(NodeId(u), MemberType.NON_VOTER, None, promote=True) for u in learners]
    return ConsensusState(1, 0, tuple(peers), NodeId(leader) if leader else None)


class Catalog:
    """A sys.catalog with an incrementally maintained CatalogMaps listening to it."""

    def __init__(self) -> None:
        self.state = SysCatalogState()
        self.maps = CatalogMaps()
        self.index = 0
        self.state.add_listener(self._listen)

    def _listen(self, change: object) -> None:
        assert isinstance(change, ApplyResult)
        self.maps.on_applied(change)

    def write(self, *ops: Insert | Update) -> ApplyResult:
        self.index += 1
        return self.state.apply(self.index, CatalogWrite(ops=ops).encode())

    def ok(self, *ops: Insert | Update) -> ApplyResult:
        result = self.write(*ops)
        assert result.ok, result.refusal
        return result

    def tablet(self, tablet_id: str) -> TabletRecord:
        row = self.state.tablet(tablet_id)
        assert row is not None
        return row.record


# --- the partition index ---------------------------------------------------------------------


def _info(tablet_id: str, start: bytes, end: bytes) -> TabletInfo:
    from service.common.partition import Partition

    rec = TabletRecord(
        TabletId(tablet_id),
        TableId("t" * 32),
        Partition((), start, end, start, end),
        TabletState.RUNNING,
        consensus(["a"]),
    )
    return TabletInfo(Row(None, 1, rec))  # type: ignore[arg-type]


def test_partition_index_finds_the_tablets_of_a_key_range_across_holes() -> None:
    # [ , b) [b, d)  hole [d, f)  [f, h)  hole [h, ...)
    tablets = [
        _info("1" * 32, b"", b"b"),
        _info("2" * 32, b"b", b"d"),
        _info("3" * 32, b"f", b"h"),
    ]
    index = PartitionIndex.of(reversed(tablets))
    assert index.starts == (b"", b"b", b"f")

    def ids(start: bytes, end: bytes = b"", limit: int = 10) -> list[str]:
        return [t.tablet_id[0] for t in index.overlapping(start, end, limit)]

    assert ids(b"") == ["1", "2", "3"]
    assert ids(b"a") == ["1", "2", "3"]  # from the tablet containing the key
    assert ids(b"b") == ["2", "3"]
    assert ids(b"c", b"f") == ["2"]  # end exclusive: [f, h) starts at the end
    assert ids(b"c", b"f\x00") == ["2", "3"]
    assert ids(b"d") == ["3"]  # in a hole: the next tablet
    assert ids(b"e", b"f") == []
    assert ids(b"h") == []  # past the last tablet's end
    assert ids(b"", limit=2) == ["1", "2"]
    assert ids(b"a", b"a") == []
    assert len(PartitionIndex().overlapping(b"x", b"", 5)) == 0


# --- maps: commit, rebuild, copy-on-write ----------------------------------------------------


def test_maps_kept_by_on_applied_equal_maps_rebuilt_from_the_rows() -> None:
    cat, ids = Catalog(), Ids()
    a = table_record(ids(), "a")
    a_tablets = tablet_records(a, ids)
    cat.ok(Insert(a), *map(Insert, a_tablets))
    b = table_record(ids(), "b", PartitionSchema(hash=(HashBucketSchema(("k",), 3),)))
    b_tablets = tablet_records(b, ids)
    cat.ok(Insert(b), *map(Insert, b_tablets))
    assert cat.maps == CatalogMaps.rebuild(cat.state)

    # Assign a's tablets, replace one, make one RUNNING with a learner.
    created = [
        dataclasses.replace(t, state=TabletState.CREATING, consensus=consensus(["s1", "s2", "s3"]))
        for t in a_tablets
    ]
    cat.ok(*map(Update, created))
    new_id = TabletId(ids())
    cat.ok(
        Update(dataclasses.replace(created[0], state=TabletState.REPLACED, replaced_by=new_id)),
        Insert(
            TabletRecord(
                new_id,
                a.table_id,
                created[0].partition,
                TabletState.PREPARING,
                replaces=created[0].tablet_id,
            )
        ),
    )
    running = dataclasses.replace(
        created[1],
        state=TabletState.RUNNING,
        consensus=consensus(["s1", "s2", "s3"], leader="s2", learners=("s4",)),
    )
    cat.ok(Update(running))
    # Swap the two tables' names in one write; then remove b.
    cat.ok(Update(dataclasses.replace(a, name="b")), Update(dataclasses.replace(b, name="a")))
    assert cat.maps.tables_by_name["a"].table_id == b.table_id
    assert cat.maps.tables_by_name["b"].table_id == a.table_id
    cat.ok(
        Update(dataclasses.replace(b, name="a", state=TableState.REMOVED)),
        *(Update(dataclasses.replace(t, state=TabletState.DELETED)) for t in b_tablets),
    )
    # Refused writes change nothing: a stale transition, an unknown table.
    view = cat.maps.view()
    assert not cat.write(Update(dataclasses.replace(b_tablets[0], state=TabletState.RUNNING))).ok
    assert not cat.write(
        Insert(
            TabletRecord(
                TabletId(ids()), TableId(ids()), a_tablets[0].partition, TabletState.PREPARING
            )
        )
    ).ok
    assert cat.maps.view() == view

    rebuilt = CatalogMaps.rebuild(cat.state)
    assert cat.maps == rebuilt
    maps = cat.maps
    recount = collections.Counter(t.state for t in maps.tablets_by_id.values())
    assert +maps.tablet_states == recount and recount[TabletState.DELETED] == len(b_tablets)
    assert set(maps.tables_by_id) == {a.table_id, b.table_id}  # removed tables kept by id
    assert set(maps.tables_by_name) == {"b"}
    assert len(maps.tablets_by_id) == len(a_tablets) + len(b_tablets) + 1
    a_info = maps.tables_by_id[a.table_id]
    assert len(a_info.tablets) == 4 and len(a_info.index) == 3  # REPLACED left the index
    assert new_id in {t.tablet_id for t in a_info.live_tablets()}
    assert len(maps.tables_by_id[b.table_id].index) == 0
    assert set(maps.pending) == {new_id, created[2].tablet_id}
    # Per-server counts from committed configs: CREATING and RUNNING only (2 tablets of a).
    assert maps.replica_counts() == {
        "s1": {a.table_id: 2},
        "s2": {a.table_id: 2},
        "s3": {a.table_id: 2},
        "s4": {a.table_id: 1},
    }


def test_commit_is_copy_on_write_for_readers() -> None:
    cat, ids = Catalog(), Ids()
    t = table_record(ids(), "t")
    tablets = tablet_records(t, ids)
    cat.ok(Insert(t), *map(Insert, tablets))
    table = cat.maps.tables_by_id[t.table_id]
    info = cat.maps.tablets_by_id[tablets[0].tablet_id]
    row_before, index_before = info.row, table.index
    loc_before = info.locations()
    assert loc_before.replicas == () and loc_before.state is TabletState.PREPARING

    new = dataclasses.replace(tablets[0], state=TabletState.CREATING, consensus=consensus(["x"]))
    cat.ok(Update(new))
    # The same info now holds the new committed row; what a reader took before is unchanged.
    assert cat.maps.tablets_by_id[new.tablet_id] is info
    assert info.record == new and info.version == 2
    assert row_before.record == tablets[0] and row_before.version == 1
    assert info.locations() != loc_before and [r.ts_uuid for r in info.locations().replicas] == [
        "x"
    ]
    assert table.index is index_before  # membership did not change: no re-index

    cat.ok(Update(dataclasses.replace(new, state=TabletState.REPLACED)))
    assert table.index is not index_before
    assert info in index_before.tablets and info not in table.index.tablets


def test_a_new_table_is_reachable_only_with_all_its_tablets_attached() -> None:
    cat, ids = Catalog(), Ids()
    t = table_record(ids(), "t")
    tablets = tablet_records(t, ids)
    seen = []

    def reader(_change: object) -> None:  # registered after the maps: runs after the commit
        table = cat.maps.tables_by_name.get("t")
        seen.append(None if table is None else len(table.live_tablets()))

    cat.state.add_listener(reader)
    cat.ok(Insert(t), *map(Insert, tablets))
    assert seen == [3]


# --- locations and reads ---------------------------------------------------------------------


def test_locations_come_from_the_committed_consensus_state() -> None:
    cat, ids = Catalog(), Ids()
    t = table_record(ids(), "t")
    tablets = tablet_records(t, ids)
    cat.ok(Insert(t), *map(Insert, tablets))
    cs = consensus(["s1", "s2", "s3"], leader="s3", learners=("s4",))
    cat.ok(
        *(
            Update(dataclasses.replace(x, state=TabletState.RUNNING, consensus=cs))
            for x in tablets[:2]
        )
    )
    cat.ok(Update(dataclasses.replace(tablets[2], state=TabletState.CREATING, consensus=cs)))
    table = resolve_table(cat.maps, TableIdentifier.by_name("t"))
    registry = {"s4": HostPort("learner.example", 7051)}
    locs = table_locations(table, b"", b"", 2, 1000, registry.get)
    assert [x.tablet_id for x in locs.tablets] == [x.tablet_id for x in tablets[:2]]
    roles = {r.ts_uuid: (r.role, r.member_type, r.address) for r in locs.tablets[0].replicas}
    assert roles == {
        "s1": (ReplicaRole.FOLLOWER, MemberType.VOTER, HostPort("s1.example", 7050)),
        "s2": (ReplicaRole.FOLLOWER, MemberType.VOTER, HostPort("s2.example", 7050)),
        "s3": (ReplicaRole.LEADER, MemberType.VOTER, HostPort("s3.example", 7050)),
        # No address in the record: the registry's (warm on every master,
        # docs/design/failover.md#R1).
        "s4": (ReplicaRole.LEARNER, MemberType.NON_VOTER, HostPort("learner.example", 7051)),
    }
    assert TabletNotRunning is errors.TabletNotRunning  # one class, TABLET_NOT_RUNNING on the wire
    with pytest.raises(TabletNotRunning, match="is CREATING, not RUNNING"):
        table_locations(table, b"", b"", 3, 1000, registry.get)
    got = tablet_locations(cat.maps, [x.tablet_id for x in tablets], registry.get)
    assert [x.tablet_id for x in got.locations] == [x.tablet_id for x in tablets[:2]]
    assert [(i, type(e)) for i, e in got.errors] == [(tablets[2].tablet_id, TabletNotRunning)]
    with pytest.raises(NotFound):
        resolve_table(cat.maps, TableIdentifier.by_name("nope"))


def test_replica_addresses_come_from_the_registry_before_the_record() -> None:
    """As Kudu: a replica is resolved through the tablet server registry, so a server that
    re-registered at a new address is found there; the record's last known address only for a
    server the registry does not know."""
    cat, ids = Catalog(), Ids()
    t = table_record(ids(), "t")
    tablets = tablet_records(t, ids)
    cat.ok(Insert(t), *map(Insert, tablets))
    cs = consensus(["s1", "s2", "s3"], leader="s1")
    cat.ok(
        *(Update(dataclasses.replace(x, state=TabletState.RUNNING, consensus=cs)) for x in tablets)
    )
    table = resolve_table(cat.maps, TableIdentifier.by_name("t"))
    ts = TSManager(ManualClock(start=1.0), 10.0)
    address_of = registry_address_of(ts)

    def addresses(tablet: int = 0) -> dict[str, HostPort | None]:
        locs = table_locations(table, b"", b"", 3, 1000, address_of)
        return {r.ts_uuid: r.address for r in locs.tablets[tablet].replicas}

    recorded = {u: HostPort(f"{u}.example", 7050) for u in ("s1", "s2", "s3")}
    assert addresses() == recorded  # nobody registered: the record's addresses
    info = cat.maps.tablets_by_id[tablets[0].tablet_id]
    first = table_locations(table, b"", b"", 1, 1000, address_of).tablets[0]
    assert first is info.locations()  # all as recorded: the memoized value itself

    # Registered at the recorded address: same answer, same object.
    ts.register(NodeInstance(NodeId("s1"), 1), TSRegistration(rpc_addresses=("s1.example:7050",)))
    assert table_locations(table, b"", b"", 1, 1000, address_of).tablets[0] is info.locations()

    # s2 re-registers at a new address: every answer names it there, at once.
    ts.register(NodeInstance(NodeId("s2"), 1), TSRegistration(rpc_addresses=("s2.new:7150",)))
    moved = {**recorded, "s2": HostPort("s2.new", 7150)}
    assert addresses(0) == addresses(2) == moved
    got = tablet_locations(cat.maps, [tablets[1].tablet_id], address_of)
    assert {r.ts_uuid: r.address for r in got.locations[0].replicas} == moved
    assert info.record.consensus == cs  # the record is not touched; only the answer
    ts.register(NodeInstance(NodeId("s2"), 2), TSRegistration(rpc_addresses=("s2.again:7250",)))
    assert addresses()["s2"] == HostPort("s2.again", 7250)

    # A new committed row (say, a new leader) drops the memo and is resolved afresh.
    cs2 = dataclasses.replace(cs, term=2, leader_uuid=NodeId("s2"))
    cat.ok(Update(dataclasses.replace(cat.tablet(tablets[0].tablet_id), consensus=cs2)))
    locs = table_locations(table, b"", b"", 1, 1000, address_of).tablets[0]
    assert {r.ts_uuid: (r.role, r.address) for r in locs.replicas} == {
        "s1": (ReplicaRole.FOLLOWER, recorded["s1"]),
        "s2": (ReplicaRole.LEADER, HostPort("s2.again", 7250)),
        "s3": (ReplicaRole.FOLLOWER, recorded["s3"]),
    }

    # A plain AddressOf works too (the registry asked once per server per call).
    asked: list[str] = []

    def counting(uuid: str) -> HostPort | None:
        asked.append(uuid)
        return {"s3": HostPort("s3.other", 1)}.get(uuid)

    locs3 = table_locations(table, b"", b"", 3, 1000, counting)
    assert sorted(asked) == ["s1", "s2", "s3"]
    assert all(
        r.address == HostPort("s3.other", 1)
        for x in locs3.tablets
        for r in x.replicas
        if r.ts_uuid == "s3"
    )


# --- tasks from committed state --------------------------------------------------------------


def _nodes(*uuids: str) -> tuple[NodeId, ...]:
    return tuple(NodeId(u) for u in uuids)


def test_tasks_follow_committed_records() -> None:
    ids = Ids()
    t = table_record(ids(), "t")
    (tab, *_) = tablet_records(t, ids)
    cs = consensus(["s1", "s2", "s3"], leader="s1")
    creating = dataclasses.replace(tab, state=TabletState.CREATING, consensus=cs)
    running = dataclasses.replace(creating, state=TabletState.RUNNING)
    altered = dataclasses.replace(t, schema=dataclasses.replace(SCHEMA, version=1))
    assert tasks_for(tab, t) == ()
    assert tasks_for(creating, t) == (
        CreateReplicas(tab.tablet_id, t.table_id, _nodes("s1", "s2", "s3"), 0),
    )
    assert tasks_for(running, t) == ()
    assert tasks_for(running, altered) == (AlterReplicas(tab.tablet_id, t.table_id, 1),)
    assert tasks_for(dataclasses.replace(running, reported_schema_version=1), altered) == ()
    deleted = dataclasses.replace(running, state=TabletState.DELETED, state_msg="dropped")
    assert tasks_for(deleted, t) == (
        DeleteReplicas(tab.tablet_id, t.table_id, _nodes("s1", "s2", "s3"), "dropped"),
    )
    assert tasks_for(dataclasses.replace(tab, state=TabletState.DELETED), t) == ()  # no replicas

    book = PendingTasks()
    book.update(creating, t)
    (task,) = book.pending()
    book.done(task)
    assert book.pending() == [] and len(book) == 1
    book.update(creating, t)  # unchanged: still done
    assert book.pending() == []
    book.update(deleted, t)  # committed state calls for something else
    assert [type(x) for x in book.pending()] == [DeleteReplicas]
    book.done(task)  # a stale done report is ignored
    assert len(book.pending()) == 1


def test_range_schema_without_columns_gives_one_tablet_in_the_index() -> None:
    cat, ids = Catalog(), Ids()
    t = table_record(ids(), "t", PartitionSchema(range=RangeSchema(())))
    tablets = tablet_records(t, ids)
    cat.ok(Insert(t), *map(Insert, tablets))
    index = cat.maps.tables_by_id[t.table_id].index
    assert len(index) == 1 and [x.tablet_id for x in index.overlapping(b"zz", b"", 5)] == [
        tablets[0].tablet_id
    ]
