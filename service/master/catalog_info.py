"""The catalog in memory: copy-on-write TableInfo/TabletInfo and the maps the master serves from.

Theory of operation
-------------------
Kudu keeps all table and tablet information in memory in copy-on-write TableInfo / TabletInfo
objects, with hash maps beside them; its multi-master design lists the maps a leader keeps and
fixes what they got wrong (docs/design/catalog.md#R3, #R10). Here:

* `TabletInfo` and `TableInfo` each hold ONE committed row of sys.catalog (`Row`: key, version,
  frozen record). The record is an immutable dataclass, so copy-on-write costs nothing: a writer
  builds the new record with `dataclasses.replace` under the info's lock; that "dirty copy" is a
  local value, never stored in the info. It is replicated as part of ONE `CatalogWrite`, and
  only once sys.catalog has applied it does `CatalogMaps.on_applied` swap the committed row in
  (the state-change contract, docs/design/catalog.md#R2..R5). Readers read `info.row` /
  `info.record` and so only ever
  see committed data, whatever writer is waiting in replication.
* `CatalogMaps` holds (docs/design/catalog.md#R10):
    - table id -> TableInfo, every table, REMOVED ones included (their records are kept
      forever, docs/design/catalog.md#R8);
    - live table name -> TableInfo (REMOVED tables left out, so a name can be reused);
    - tablet id -> TabletInfo, every tablet, REPLACED and DELETED ones included;
    - per table, every tablet of it (`TableInfo.tablets`) and the partition index
      partition-key-start -> tablet (`TableInfo.index`, Kudu's
      "[tablet-start-key] -> TabletInfo") holding the tablets that own their partition now
      (PREPARING, CREATING, RUNNING). GetTableLocations is one bisect in it.
  Beside them, derived the same way: the tablets waiting for assignment (PREPARING or
  CREATING) and, per tablet server, its replicas per table (for placement).
* There is NO per-tablet replica-location cache (docs/design/catalog.md#R10; KUDU-1353): such
  a cache, filled only
  by tablet reports, is empty on a new leader, and AlterTable, GetTableLocations and DeleteTable
  then misbehave. Locations are derived from the tablet record's committed consensus state
  (`TabletInfo.locations`, memoized per committed row: it is a pure function of the row, not a
  second source of truth). A replica's address is resolved as Kudu does, through the tablet
  server registry: the server's current registered rpc address (`TSManager.rpc_address`, a
  dict lookup without a snapshot copy), so a server that re-registered at a new address is
  found there; only a server the registry does not know falls back to its peer's
  `last_known_addr` in the committed config (recorded from the registration at assignment).
  Wire it with `catalog_reads.registry_address_of(ts_manager)`. One call asks the registry
  once per server and once per replica set; a tablet whose servers' addresses are the ones of
  its previous answer gets that answer back (the parsed addresses are shared objects, so the
  check is an identity compare), and when every address agrees with the record the memoized
  locations themselves are returned.

Building the maps. `CatalogMaps.rebuild(state)` builds everything from sys.catalog's rows: a new
leader does it before it serves (replay, then serve: docs/design/coordinator.md#R4).
`on_applied(result)` commits one applied write: the catalog manager registers it as sys.catalog's
listener, so it runs on every master, followers included, from the applying task, before
`RaftNode.propose` returns to the proposer. So followers' maps stay warm, and a writer finds its
change committed in memory when its replication returns. Within one write, tablet rows are committed
before table rows (docs/design/catalog.md#R5: tablet mutations come first); a new table becomes
reachable through the id and name maps only after its tablets are attached to it. Everything is
deterministic in the rows: an incrementally maintained `CatalogMaps` equals one rebuilt from
the same state (`==`), which the tests check.

Locks. Every TableInfo and TabletInfo has a lock, held by a writer from building its new
records until the replicated write has been committed in memory (or has failed). Readers never
take them. A tablet's is an `asyncio.Lock`; a table's is a readers-writer lock (`RWLock`), as
Kudu's: a writer of the table record (AlterTable, DeleteTable) takes it exclusively, a writer
of tablets only (a tablet report, an assignment round) shared, so the reports of a large
table's replicas do not queue behind one another (their tablet locks still order them per
tablet). The order, which every writer follows so no two can deadlock:

  1. table locks before tablet locks (docs/design/catalog.md#R2);
  2. several tables: in table id order; several tablets: in tablet id order.

Reads: `catalog_reads` (the lookups clients make, as pure functions of these maps).

Ownership: one asyncio event loop owns the maps. `on_applied` and `rebuild` never await, so a
reader that does not await in the middle of a lookup sees whole writes only.
"""

from __future__ import annotations

import asyncio
import bisect
import enum
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from service.common.ids import NodeId, TableId, TabletId
from service.common.partition import Partition
from service.common.rwlock import RWLock
from service.master.catalog_records import (
    HostPort,
    MemberType,
    TableRecord,
    TabletRecord,
    TabletState,
)
from service.master.sys_catalog import ApplyResult, Row, SysCatalogState

__all__ = [
    "HOSTED_STATES",
    "LIVE_TABLET_STATES",
    "CatalogMaps",
    "MapsDelta",
    "PartitionIndex",
    "ReplicaLocation",
    "ReplicaRole",
    "TableInfo",
    "TabletInfo",
    "TabletLocations",
]

LIVE_TABLET_STATES = frozenset({TabletState.PREPARING, TabletState.CREATING, TabletState.RUNNING})
"""States of a tablet that owns its partition (in its table's partition index)."""
HOSTED_STATES = frozenset({TabletState.CREATING, TabletState.RUNNING})
"""States in which the peers of a tablet's committed config host (or are creating) replicas:
these count in the per-server replica counts placement ranks by."""
_PENDING_STATES = frozenset({TabletState.PREPARING, TabletState.CREATING})


# --- locations -------------------------------------------------------------------------------


class ReplicaRole(enum.Enum):
    """A replica's role as the committed consensus state says (RaftRolePB's names)."""

    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"
    LEARNER = "LEARNER"


@dataclass(frozen=True, slots=True)
class ReplicaLocation:
    """One replica of a tablet, as a client routes to it."""

    ts_uuid: NodeId
    role: ReplicaRole
    member_type: MemberType
    address: HostPort | None
    """Memoized per committed row: the peer's last known address from the committed config
    (None when it has none). As returned by the lookups: the server's current registered rpc
    address, that last known address only when the registry does not know the server."""


@dataclass(frozen=True, slots=True)
class TabletLocations:
    """Where a tablet's replicas are, derived from its committed record alone."""

    tablet_id: TabletId
    table_id: TableId
    partition: Partition
    state: TabletState
    replicas: tuple[ReplicaLocation, ...]
    config_index: int
    """The committed config's op index (the compare-and-set token,
    docs/design/tablet_copy.md#R8); 0 without one."""


def _locations_of(record: TabletRecord) -> TabletLocations:
    replicas: tuple[ReplicaLocation, ...] = ()
    config_index = 0
    cs = record.consensus
    if cs is not None:
        config_index = cs.config_index
        out = []
        for peer in cs.peers:
            if peer.uuid == cs.leader_uuid:
                role = ReplicaRole.LEADER
            elif peer.member_type is MemberType.VOTER:
                role = ReplicaRole.FOLLOWER
            else:
                role = ReplicaRole.LEARNER
            out.append(ReplicaLocation(peer.uuid, role, peer.member_type, peer.last_known_addr))
        replicas = tuple(out)
    return TabletLocations(
        record.tablet_id, record.table_id, record.partition, record.state, replicas, config_index
    )


# --- the infos -------------------------------------------------------------------------------


class TabletInfo:
    """One tablet: its committed row (copy-on-write, module docstring) and its lock.

    Invariants: `row.key` names this tablet and never changes table or partition (sys.catalog
    refuses both); `row` is replaced only by `CatalogMaps` after sys.catalog applied the new
    one; `_locations` is None or `_locations_of(row.record)`; `_served` is None or (the
    replicas' server uuids, the addresses the registry gave for them, the locations answered
    with those), all of the committed row.
    """

    __slots__ = ("_locations", "_lock", "_row", "_served", "tablet_id")

    def __init__(self, row: Row[TabletRecord]) -> None:
        self.tablet_id: TabletId = row.record.tablet_id
        self._row = row
        self._locations: TabletLocations | None = None
        self._served: (
            tuple[tuple[str, ...], tuple[HostPort | None, ...], TabletLocations] | None
        ) = None
        self._lock: asyncio.Lock | None = None

    @property
    def row(self) -> Row[TabletRecord]:
        """The committed row."""
        return self._row

    @property
    def record(self) -> TabletRecord:
        return self._row.record

    @property
    def version(self) -> int:
        """The committed row's version: what a write's precondition on this tablet names."""
        return self._row.version

    @property
    def table_id(self) -> TableId:
        return self._row.record.table_id

    @property
    def state(self) -> TabletState:
        return self._row.record.state

    @property
    def partition(self) -> Partition:
        return self._row.record.partition

    @property
    def lock(self) -> asyncio.Lock:
        """The tablet's write lock (created on first use: most tablets are never locked)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def locations(self) -> TabletLocations:
        """Replica locations from the committed consensus state (memoized per committed row)."""
        loc = self._locations
        if loc is None:
            loc = self._locations = _locations_of(self._row.record)
        return loc

    def _commit(self, row: Row[TabletRecord]) -> None:
        self._row = row
        self._locations = None
        self._served = None

    def __repr__(self) -> str:
        return f"TabletInfo({self.tablet_id!r}, {self.state.name}, v{self.version})"


@dataclass(frozen=True, slots=True)
class PartitionIndex:
    """A table's live tablets sorted by (partition_key_start, tablet id): the bisect map of
    docs/design/catalog.md#R10. Immutable: rebuilt when a tablet joins or leaves the live set, so a
    reader that took it keeps a consistent list. `starts[i]`/`ends[i]` are `tablets[i]`'s partition
    keys (partitions never change, so they can be kept beside the infos)."""

    starts: tuple[bytes, ...] = ()
    ends: tuple[bytes, ...] = ()
    tablets: tuple[TabletInfo, ...] = ()

    @classmethod
    def of(cls, tablets: Iterable[TabletInfo]) -> PartitionIndex:
        ordered = sorted(tablets, key=lambda t: (t.partition.partition_key_start, t.tablet_id))
        return cls(
            tuple(t.partition.partition_key_start for t in ordered),
            tuple(t.partition.partition_key_end for t in ordered),
            tuple(ordered),
        )

    def __len__(self) -> int:
        return len(self.tablets)

    def overlapping(self, start: bytes, end: bytes, limit: int) -> list[TabletInfo]:
        """At most `limit` tablets, by start key, whose partition meets [start, end) (b"" end:
        unbounded), beginning with the one containing `start` if any (a range hole skipped)."""
        if end and start >= end:
            return []  # an empty range
        starts = self.starts
        i = bisect.bisect_right(starts, start) - 1
        if i < 0:
            i = 0
        else:
            e = self.ends[i]
            if e and e <= start:
                i += 1  # start falls in a hole after tablet i
        n = len(starts)
        stop = n if not end else bisect.bisect_left(starts, end, i)
        stop = min(stop, i + limit)
        return list(self.tablets[i:stop]) if i < stop else []

    def ids(self) -> tuple[tuple[bytes, TabletId], ...]:
        return tuple((t.partition.partition_key_start, t.tablet_id) for t in self.tablets)


class TableInfo:
    """One table: its committed row, its tablets, its partition index and its lock.

    Invariants: `_tablets` holds every tablet of the table the maps know, any state;
    `_live` those in LIVE_TABLET_STATES; `_index` is `PartitionIndex.of(_live.values())`
    whenever control is outside `CatalogMaps` (rebuilt once per write that changes `_live`);
    `locations_version` changes whenever one of its tablets' rows does.
    """

    __slots__ = ("_index", "_live", "_lock", "_row", "_tablets", "locations_version", "table_id")

    def __init__(self, row: Row[TableRecord]) -> None:
        self.table_id: TableId = row.record.table_id
        self._row = row
        self._tablets: dict[TabletId, TabletInfo] = {}
        self._live: dict[TabletId, TabletInfo] = {}
        self._index = PartitionIndex()
        self._lock: RWLock | None = None
        self.locations_version = 0
        """Bumped by `CatalogMaps.on_applied` for every write of one of the table's tablets'
        rows: locations built from this table are current while it is unchanged
        (`locations_cache`; the table's own row is not in them)."""

    @property
    def row(self) -> Row[TableRecord]:
        return self._row

    @property
    def record(self) -> TableRecord:
        return self._row.record

    @property
    def version(self) -> int:
        return self._row.version

    @property
    def name(self) -> str:
        return self._row.record.name

    @property
    def is_removed(self) -> bool:
        return self._row.record.is_removed

    @property
    def lock(self) -> RWLock:
        """The table's lock, taken before any of its tablets' locks: `exclusive()` by writers
        of the table record, `shared()` by writers of its tablets only (module docstring)."""
        if self._lock is None:
            self._lock = RWLock()
        return self._lock

    @property
    def tablets(self) -> Mapping[TabletId, TabletInfo]:
        """Every tablet of the table, any state (read-only view; do not keep across awaits)."""
        return self._tablets

    @property
    def index(self) -> PartitionIndex:
        """The live tablets by partition key start (an immutable snapshot)."""
        return self._index

    def live_tablets(self) -> tuple[TabletInfo, ...]:
        """The tablets owning their partition now, by partition key."""
        return self._index.tablets

    def __repr__(self) -> str:
        return f"TableInfo({self.table_id!r}, {self.name!r}, {self.record.state.name})"


# --- the maps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class MapsDelta:
    """What one `on_applied` changed, for the catalog manager's follow-ups (tasks, counts)."""

    tablets: tuple[tuple[TabletRecord | None, TabletRecord], ...] = ()
    """(committed before or None if new, committed now), in write order."""
    tables: tuple[tuple[TableRecord | None, TableRecord], ...] = ()
    servers: frozenset[str] = frozenset()
    """Tablet servers whose replica counts changed."""


class CatalogMaps:
    """The maps of docs/design/catalog.md#R10 (module docstring), built from sys.catalog and kept by
    `on_applied`.

    Invariants (between calls):
      * `tables_by_id[t].table_id == t`, every table row present;
      * `tables_by_name[n]` is the table named `n` iff it is not REMOVED;
      * `tablets_by_id[x]` for every tablet row; it sits in `tables_by_id[its table].tablets`;
      * `pending` = ids of tablets in PREPARING or CREATING;
      * `_replicas[u][t]` = number of tablets of table `t` in HOSTED_STATES whose committed
        config has peer `u` (only positive counts are kept);
      * `tablet_states[s]` = number of tablets in state `s`.
    """

    def __init__(self) -> None:
        self.tables_by_id: dict[TableId, TableInfo] = {}
        self.tables_by_name: dict[str, TableInfo] = {}
        self.tablets_by_id: dict[TabletId, TabletInfo] = {}
        self.pending: set[TabletId] = set()
        self.preparing: dict[TableId, set[TabletId]] = {}
        """PREPARING tablets (a subset of `pending`) by table: what assignment places. Kept
        apart so a round finds them without sorting every pending tablet (a 10,000-tablet
        table is placed in fifty bounded rounds)."""
        self._preparing_order: dict[TableId, list[TabletInfo]] = {}
        """Per table, its PREPARING tablets in partition order as last sorted; may also hold
        tablets that left PREPARING since (skipped on reading), dropped when one is added."""
        self._replicas: dict[str, dict[str, int]] = {}
        self.tablet_states: Counter[TabletState] = Counter()
        """Tablets by committed state, kept as rows commit (read it, never change it): /metrics
        reads it on every scrape, and counting 200,000 tablets there took about 0.1 s of the
        leader's loop per scrape."""

    @classmethod
    def rebuild(cls, state: SysCatalogState) -> CatalogMaps:
        """Everything from sys.catalog's rows (a new leader, a restored snapshot)."""
        maps = cls()
        for table_row in state.tables():
            table = TableInfo(table_row)
            maps.tables_by_id[table.table_id] = table
            if not table.is_removed:
                maps.tables_by_name[table.name] = table
            for tablet_row in state.tablets_of(table.table_id):
                tablet = TabletInfo(tablet_row)
                maps._attach(table, tablet)
                maps._count(tablet.record, +1)
                maps.tablet_states[tablet.state] += 1
            table._index = PartitionIndex.of(table._live.values())
        return maps

    # --- commit ------------------------------------------------------------------------------

    def on_applied(self, result: ApplyResult) -> MapsDelta:
        """Commit the rows of one applied write into memory: tablets first, then tables.

        Refusals and answered retries changed nothing and are ignored. Rows of other entry
        types (CA, signing keys) are not kept here.
        """
        if not result.ok or result.duplicate_of is not None:
            return MapsDelta()
        tablet_rows: list[Row[TabletRecord]] = []
        table_rows: list[Row[TableRecord]] = []
        for row in result.written:
            if isinstance(row.record, TabletRecord):
                tablet_rows.append(cast(Row[TabletRecord], row))
            elif isinstance(row.record, TableRecord):
                table_rows.append(cast(Row[TableRecord], row))
        if not tablet_rows and not table_rows:
            return MapsDelta()
        # New tables are staged, not yet reachable: their tablets attach to them first.
        staged = {
            r.record.table_id: TableInfo(r)
            for r in table_rows
            if r.record.table_id not in self.tables_by_id
        }
        servers: set[str] = set()
        reindex: dict[TableId, TableInfo] = {}
        tablet_changes: list[tuple[TabletRecord | None, TabletRecord]] = []
        for row in tablet_rows:
            rec = row.record
            table = self.tables_by_id.get(rec.table_id) or staged[rec.table_id]
            info = self.tablets_by_id.get(rec.tablet_id)
            old = info.record if info is not None else None
            if old is not None:
                servers |= self._count(old, -1)
                self.tablet_states[old.state] -= 1
            self.tablet_states[rec.state] += 1
            if info is None:
                info = TabletInfo(row)
                self._attach(table, info)
                reindex[table.table_id] = table
            else:
                info._commit(row)
                was_live = info.tablet_id in table._live
                is_live = rec.state in LIVE_TABLET_STATES
                if was_live != is_live:
                    if is_live:
                        table._live[info.tablet_id] = info
                    else:
                        del table._live[info.tablet_id]
                    reindex[table.table_id] = table
                self._track_pending(info)
            servers |= self._count(rec, +1)
            tablet_changes.append((old, rec))
            table.locations_version += 1
        for table in reindex.values():
            table._index = PartitionIndex.of(table._live.values())
        table_changes: list[tuple[TableRecord | None, TableRecord]] = []
        for trow in table_rows:
            rec_t = trow.record
            fresh = staged.get(rec_t.table_id)
            if fresh is not None:
                self.tables_by_id[rec_t.table_id] = fresh
                table_changes.append((None, rec_t))
                table = fresh
            else:
                table = self.tables_by_id[rec_t.table_id]
                old_t = table.record
                if self.tables_by_name.get(old_t.name) is table:
                    del self.tables_by_name[old_t.name]
                table._row = trow
                table_changes.append((old_t, rec_t))
            if not rec_t.is_removed:
                self.tables_by_name[rec_t.name] = table
        return MapsDelta(tuple(tablet_changes), tuple(table_changes), frozenset(servers))

    def _attach(self, table: TableInfo, tablet: TabletInfo) -> None:
        self.tablets_by_id[tablet.tablet_id] = tablet
        table._tablets[tablet.tablet_id] = tablet
        if tablet.state in LIVE_TABLET_STATES:
            table._live[tablet.tablet_id] = tablet
        self._track_pending(tablet)

    def _track_pending(self, tablet: TabletInfo) -> None:
        """Keep `pending` and `preparing` in step with the tablet's committed state."""
        tablet_id, table_id, state = tablet.tablet_id, tablet.table_id, tablet.state
        if state in _PENDING_STATES:
            self.pending.add(tablet_id)
        else:
            self.pending.discard(tablet_id)
        ids = self.preparing.get(table_id)
        if state is TabletState.PREPARING:
            if ids is None:
                ids = self.preparing[table_id] = set()
            if tablet_id not in ids:
                ids.add(tablet_id)
                self._preparing_order.pop(table_id, None)
        elif ids is not None and tablet_id in ids:
            ids.discard(tablet_id)
            if not ids:
                del self.preparing[table_id]
                self._preparing_order.pop(table_id, None)

    def _count(self, record: TabletRecord, delta: int) -> set[str]:
        """Add `delta` replicas of `record`'s table to each of its peers; returns their uuids."""
        if record.state not in HOSTED_STATES or record.consensus is None:
            return set()
        touched: set[str] = set()
        for peer in record.consensus.peers:
            by_table = self._replicas.setdefault(peer.uuid, {})
            n = by_table.get(record.table_id, 0) + delta
            if n > 0:
                by_table[record.table_id] = n
            else:
                by_table.pop(record.table_id, None)
                if not by_table:
                    del self._replicas[peer.uuid]
            touched.add(peer.uuid)
        return touched

    # --- lookups -----------------------------------------------------------------------------

    def table(self, table_id: str) -> TableInfo | None:
        return self.tables_by_id.get(TableId(table_id))

    def live_table(self, name: str) -> TableInfo | None:
        return self.tables_by_name.get(name)

    def tablet(self, tablet_id: str) -> TabletInfo | None:
        return self.tablets_by_id.get(TabletId(tablet_id))

    def live_tables(self) -> Iterator[TableInfo]:
        """Live tables, in no particular order."""
        return iter(self.tables_by_name.values())

    def preparing_tablets(self, table_id: TableId) -> Iterator[TabletInfo]:
        """The table's PREPARING tablets in partition order (sorted once per change of the
        set, not per call)."""
        ids = self.preparing.get(table_id)
        if not ids:
            return
        order = self._preparing_order.get(table_id)
        if order is None:
            order = sorted(
                (self.tablets_by_id[t] for t in ids),
                key=lambda t: (t.partition.partition_key_start, t.tablet_id),
            )
            self._preparing_order[table_id] = order
        for info in order:
            if info.tablet_id in ids:
                yield info

    def replica_counts(self) -> dict[str, dict[str, int]]:
        """Server uuid -> table id -> replicas hosted (a copy), from committed configs."""
        return {u: dict(c) for u, c in self._replicas.items()}

    def replica_counts_of(self, uuid: str) -> dict[str, int]:
        return dict(self._replicas.get(uuid, {}))

    # --- comparison --------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """Everything the maps hold, as plain comparable values (for equality and tests)."""
        return {
            "tables": {t: i.row for t, i in sorted(self.tables_by_id.items())},
            "names": {n: i.table_id for n, i in sorted(self.tables_by_name.items())},
            "tablets": {t: i.row for t, i in sorted(self.tablets_by_id.items())},
            "table_tablets": {
                t: tuple(sorted(i.tablets)) for t, i in sorted(self.tables_by_id.items())
            },
            "index": {t: i.index.ids() for t, i in sorted(self.tables_by_id.items())},
            "pending": tuple(sorted(self.pending)),
            "preparing": {t: tuple(sorted(ids)) for t, ids in sorted(self.preparing.items())},
            "replicas": self.replica_counts(),
            "states": dict(sorted((s.name, n) for s, n in self.tablet_states.items() if n)),
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CatalogMaps):
            return NotImplemented
        return self.view() == other.view()

    __hash__ = None  # type: ignore[assignment]
