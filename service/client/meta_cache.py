"""What the client knows about tables and where their tablets live.

Theory of operation
-------------------
Routing a row needs the table's schema and partition schema (to compute the row's partition
key, `service.common.partition`) and the tablet whose [partition_key_start, partition_key_end)
holds that key, with its replicas and which of them leads. Asking the master for every write
would make it the bottleneck of every data operation, so the client caches, as Kudu's
MetaCache does:

* a `TableHandle` per table name: schema, partition schema, replication. Refreshed on demand
  (a schema error from a tablet server, `open_table(refresh=True)`).
* per table, the tablets by `partition_key_start` (a sorted list, found by bisect), each with
  the expiry the master granted (`ttl_ms`). A lookup of an unknown or expired key fetches
  locations from that key on, a page of tablets at a time.

Entries are dropped, never patched in place from guesses, when a tablet server says the cache is
wrong: NOT_FOUND for the tablet (deleted, or replaced after an assignment timeout), or a replica
that no longer answers. The one local correction is `note_leader`: a NOT_THE_LEADER hint names
the new leader, and the next request goes straight there (the master learns the same fact only
at the next tablet report).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from service.client.master_client import MasterClient
from service.common.errors import NotFound
from service.common.partition import Partition, PartitionSchema
from service.common.schema import Schema
from service.common.schema_codec import (
    partition_from_pb,
    partition_schema_from_pb,
    schema_from_pb,
)
from service.pb import master_pb2 as pb

__all__ = ["MetaCache", "Replica", "TableHandle", "TabletLocation"]

LOCATIONS_PAGE = 100
"""Tablets asked for per GetTableLocations when filling the cache."""


@dataclass(frozen=True)
class TableHandle:
    """The client's view of an opened table: what routing a row and checking a write need.

    Not the master's `TableInfo` (its copy-on-write catalog entry, Kudu's name): a handle is a
    snapshot the client refreshes on demand, never a record of the catalog's state."""

    table_id: str
    name: str
    schema: Schema
    partition_schema: PartitionSchema
    num_replicas: int


@dataclass(frozen=True)
class Replica:
    ts_uuid: str
    address: str
    is_leader: bool
    is_voter: bool

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0]


@dataclass(frozen=True)
class TabletLocation:
    tablet_id: str
    table_id: str
    partition: Partition
    replicas: tuple[Replica, ...]
    config_opid_index: int = 0
    expires_at: float = field(default=float("inf"), compare=False)

    @property
    def start(self) -> bytes:
        return self.partition.partition_key_start

    @property
    def end(self) -> bytes:
        return self.partition.partition_key_end

    def leader(self) -> Replica | None:
        return next((r for r in self.replicas if r.is_leader), None)

    def replica(self, ts_uuid: str) -> Replica | None:
        return next((r for r in self.replicas if r.ts_uuid == ts_uuid), None)

    def with_leader(self, ts_uuid: str) -> TabletLocation:
        reps = tuple(replace(r, is_leader=r.ts_uuid == ts_uuid) for r in self.replicas)
        return replace(self, replicas=reps)


def table_handle_from_pb(r: pb.GetTableSchemaResponsePB) -> TableHandle:
    schema = schema_from_pb(r.schema)
    return TableHandle(
        table_id=r.table_id,
        name=r.table_name,
        schema=schema,
        partition_schema=partition_schema_from_pb(r.partition_schema, schema),
        num_replicas=r.num_replicas,
    )


def location_from_pb(t: pb.TabletLocationsPB, expires_at: float) -> TabletLocation:
    replicas = tuple(
        Replica(
            ts_uuid=r.ts_uuid,
            address=f"{r.rpc_address.host}:{r.rpc_address.port}",
            is_leader=r.role == pb.LEADER,
            is_voter=r.member_type != pb.NON_VOTER,
        )
        for r in t.replicas
    )
    return TabletLocation(
        tablet_id=t.tablet_id,
        table_id=t.table_id,
        partition=partition_from_pb(t.partition),
        replicas=replicas,
        config_opid_index=t.config_opid_index,
        expires_at=expires_at,
    )


class _TabletMap:
    """One table's cached tablets, sorted by partition_key_start, non-overlapping."""

    def __init__(self) -> None:
        self.starts: list[bytes] = []
        self.tablets: list[TabletLocation] = []

    def find(self, key: bytes) -> TabletLocation | None:
        i = bisect.bisect_right(self.starts, key) - 1
        if i >= 0 and self.tablets[i].partition.contains(key):
            return self.tablets[i]
        return None

    def put(self, loc: TabletLocation) -> None:
        """Insert `loc`, dropping every cached tablet whose key interval overlaps it."""
        keep = [
            t
            for t in self.tablets
            if t.tablet_id != loc.tablet_id and not _overlaps(t.partition, loc.partition)
        ]
        keep.append(loc)
        keep.sort(key=lambda t: t.start)
        self.tablets = keep
        self.starts = [t.start for t in keep]

    def drop(self, tablet_id: str) -> bool:
        for i, t in enumerate(self.tablets):
            if t.tablet_id == tablet_id:
                del self.tablets[i]
                del self.starts[i]
                return True
        return False

    def replace(self, loc: TabletLocation) -> None:
        for i, t in enumerate(self.tablets):
            if t.tablet_id == loc.tablet_id:
                self.tablets[i] = loc


def _overlaps(a: Partition, b: Partition) -> bool:
    a_below_b_end = not b.partition_key_end or a.partition_key_start < b.partition_key_end
    b_below_a_end = not a.partition_key_end or b.partition_key_start < a.partition_key_end
    return a_below_b_end and b_below_a_end


class MetaCache:
    """Tables by name and tablet locations by partition key, filled from the master."""

    def __init__(
        self,
        master: MasterClient,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._master = master
        self._clock = clock
        self._tables: dict[str, TableHandle] = {}
        self._maps: dict[str, _TabletMap] = {}
        self.location_fetches = 0
        """GetTableLocations calls made (tests assert that caching works)."""
        self._authz: dict[str, bytes] = {}
        """The newest authz token the master sent with each table's locations (callers with
        a user identity get one; tablet servers check their writes and scans against it)."""

    # --- tables ------------------------------------------------------------------------------

    async def table(self, name: str, timeout: float, *, refresh: bool = False) -> TableHandle:
        info = None if refresh else self._tables.get(name)
        if info is None:
            r = await self._master.call(
                "GetTableSchema",
                pb.GetTableSchemaRequestPB(table=pb.TableIdentifierPB(table_name=name)),
                timeout,
            )
            info = table_handle_from_pb(r)
            old = self._tables.get(name)
            if old is not None and old.table_id != info.table_id:
                self._maps.pop(old.table_id, None)  # dropped and re-created under this name
            self._tables[name] = info
        return info

    def forget_table(self, name: str) -> None:
        info = self._tables.pop(name, None)
        if info is not None:
            self._maps.pop(info.table_id, None)

    # --- tablets -----------------------------------------------------------------------------

    async def _fetch(
        self, table_id: str, start: bytes, end: bytes, limit: int, timeout: float
    ) -> list[TabletLocation]:
        r: pb.GetTableLocationsResponsePB = await self._master.call(
            "GetTableLocations",
            pb.GetTableLocationsRequestPB(
                table=pb.TableIdentifierPB(table_id=table_id),
                partition_key_start=start,
                partition_key_end=end,
                max_returned_locations=limit,
            ),
            timeout,
        )
        self.location_fetches += 1
        if r.authz_token:
            self._authz[table_id] = r.authz_token
        expires = self._clock() + r.ttl_ms / 1000.0 if r.ttl_ms else float("inf")
        m = self._maps.setdefault(table_id, _TabletMap())
        out = [location_from_pb(t, expires) for t in r.tablet_locations]
        for loc in out:
            m.put(loc)
        return out

    async def lookup(self, table_id: str, partition_key: bytes, timeout: float) -> TabletLocation:
        """The tablet holding `partition_key`; NotFound when the key falls in a range hole."""
        m = self._maps.get(table_id)
        hit = m.find(partition_key) if m is not None else None
        if hit is not None and hit.expires_at > self._clock():
            return hit
        fetched = await self._fetch(table_id, partition_key, b"", LOCATIONS_PAGE, timeout)
        for loc in fetched:
            if loc.partition.contains(partition_key):
                return loc
        raise NotFound(
            f"table {table_id}: no tablet covers partition key 0x{partition_key.hex()} "
            "(outside every range partition)"
        )

    async def tablets(
        self, table_id: str, timeout: float, start: bytes = b"", end: bytes = b""
    ) -> list[TabletLocation]:
        """Every tablet overlapping [start, end) (b"" unbounded), fresh from the master."""
        out: list[TabletLocation] = []
        key = start
        while True:
            page = await self._fetch(table_id, key, end, LOCATIONS_PAGE, timeout)
            out.extend(t for t in page if t.tablet_id not in {o.tablet_id for o in out})
            if len(page) < LOCATIONS_PAGE:
                return out
            last_end = page[-1].end
            if not last_end or (end and last_end >= end):
                return out
            key = last_end

    def authz_token(self, table_id: str) -> bytes:
        """The authz token for the table (b"" when the master sent none: admins and servers
        need none)."""
        return self._authz.get(table_id, b"")

    async def refresh_authz_token(self, table_id: str, timeout: float) -> bytes:
        """A fresh authz token, after a tablet server refused the one we had (expired, or a
        grant changed): one GetTableLocations of one tablet."""
        self._authz.pop(table_id, None)
        await self._fetch(table_id, b"", b"", 1, timeout)
        return self.authz_token(table_id)

    def cached(self, table_id: str) -> Sequence[TabletLocation]:
        m = self._maps.get(table_id)
        return list(m.tablets) if m is not None else []

    def invalidate(self, table_id: str, tablet_id: str) -> None:
        m = self._maps.get(table_id)
        if m is not None:
            m.drop(tablet_id)

    def note_leader(self, loc: TabletLocation, ts_uuid: str) -> TabletLocation:
        """Record that `ts_uuid` leads `loc`'s tablet (from a NOT_THE_LEADER hint)."""
        if loc.replica(ts_uuid) is None:
            return loc
        new = loc.with_leader(ts_uuid)
        m = self._maps.get(loc.table_id)
        if m is not None:
            m.replace(new)
        return new
