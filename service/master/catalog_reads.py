"""The catalog's reads: the lookups clients make, as pure functions of `CatalogMaps`.

The lookups (a table by id or name, its schema and creation status, the tablets of a partition-
key range with their replicas, tablets by id) read the maps of `catalog_info`; the catalog
manager checks readiness and arguments and calls them. GetTableLocations behaves as Kudu's: if a
tablet in the range is not RUNNING yet (PREPARING, CREATING) the whole call fails with
`errors.TabletNotRunning` (TABLET_NOT_RUNNING, gRPC UNAVAILABLE, retryable; re-exported here)
and the client retries; a tablet is never returned without its replicas.

Replica addresses come from the tablet-server registry, not from a cache filled by reports
(`catalog_info`'s docstring, KUDU-1353): wire `registry_address_of(ts_manager)`. One call asks
the registry once per server and once per replica set, and a tablet whose servers' addresses
are those of its previous answer gets that answer back (an identity compare).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from service.common.errors import InvalidArgument, NotFound, TabletNotRunning, TesseraError
from service.common.ids import TableId, validate_uuid
from service.common.partition import PartitionSchema
from service.common.schema import Schema
from service.master.catalog_info import CatalogMaps, TableInfo, TabletInfo, TabletLocations
from service.master.catalog_records import HostPort, TableState, TabletState

__all__ = [
    "AddressOf",
    "AlterTableStatus",
    "CreateTableStatus",
    "ListedTable",
    "RpcAddresses",
    "TableIdentifier",
    "TableLocations",
    "TableSchemaInfo",
    "TabletLocationsResult",
    "TabletNotRunning",
    "alter_status",
    "create_status",
    "list_tables",
    "registry_address_of",
    "resolve_table",
    "table_locations",
    "table_schema",
    "tablet_locations",
]

AddressOf = Callable[[str], HostPort | None]
"""A tablet server's current registered rpc address by uuid (the TSManager, warm on every
master); None for a server that never registered here."""


class RpcAddresses(Protocol):
    """What `registry_address_of` needs of the tablet server registry (`TSManager`)."""

    def rpc_address(self, uuid: str) -> str | None: ...


_MAX_PARSED_ADDRESSES = 4096


def registry_address_of(registry: RpcAddresses) -> AddressOf:
    """An `AddressOf` over the registry's cheap `rpc_address` (no snapshot copy); "host:port"
    strings (validated at registration) are parsed once each."""
    parsed: dict[str, HostPort] = {}

    def address_of(uuid: str) -> HostPort | None:
        address = registry.rpc_address(uuid)
        if address is None:
            return None
        hp = parsed.get(address)
        if hp is None:
            if len(parsed) >= _MAX_PARSED_ADDRESSES:
                parsed.clear()
            host, _, port = address.rpartition(":")
            hp = parsed[address] = HostPort(host, int(port))
        return hp

    return address_of


class _Resolver:
    """The registry asked at most once per server in one call (one answer is one instant of
    the registry), and once per replica set: a call names few servers across many replicas."""

    __slots__ = ("_address_of", "_by_peers", "_by_server")

    def __init__(self, address_of: AddressOf) -> None:
        self._address_of = address_of
        self._by_server: dict[str, HostPort | None] = {}
        self._by_peers: dict[tuple[str, ...], tuple[HostPort | None, ...]] = {}

    def addresses(self, uuids: tuple[str, ...]) -> tuple[HostPort | None, ...]:
        found = self._by_peers.get(uuids)
        if found is None:
            found = self._by_peers[uuids] = tuple([self._server(u) for u in uuids])
        return found

    def _server(self, uuid: str) -> HostPort | None:
        if uuid in self._by_server:
            return self._by_server[uuid]
        found = self._by_server[uuid] = self._address_of(uuid)
        return found


@dataclass(frozen=True)
class TableIdentifier:
    """A table by id (preferred: ids are never reused) and/or by live name; both must agree."""

    table_id: str | None = None
    name: str | None = None

    @classmethod
    def by_id(cls, table_id: str) -> TableIdentifier:
        return cls(table_id=table_id)

    @classmethod
    def by_name(cls, name: str) -> TableIdentifier:
        return cls(name=name)

    @classmethod
    def checked(cls, table: object) -> TableIdentifier:
        """`table` validated, its id in canonical form; InvalidArgument naming the field."""
        if not isinstance(table, TableIdentifier):
            raise InvalidArgument(f"table: expected a TableIdentifier, got {table!r}")
        table_id, name = table.table_id, table.name
        if table_id is None and name is None:
            raise InvalidArgument("table: give a table id or a table name")
        if table_id is not None:
            try:
                table_id = validate_uuid(table_id)
            except InvalidArgument as e:
                raise InvalidArgument(f"table.table_id: {e.message}") from None
        if name is not None and (not isinstance(name, str) or not name):
            raise InvalidArgument(f"table.name: must be a non-empty string, got {name!r}")
        return table if table_id == table.table_id else cls(table_id, name)


@dataclass(frozen=True)
class CreateTableStatus:
    done: bool
    """Every tablet RUNNING."""
    tablets_running: int
    tablets_total: int


@dataclass(frozen=True)
class AlterTableStatus:
    done: bool
    schema_version: int


@dataclass(frozen=True)
class ListedTable:
    table_id: TableId
    name: str
    state: TableState
    schema_version: int
    num_replicas: int
    num_tablets: int
    owner: str


@dataclass(frozen=True)
class TableSchemaInfo:
    table_id: TableId
    name: str
    schema: Schema
    partition_schema: PartitionSchema
    num_replicas: int
    create_table_done: bool


@dataclass(frozen=True)
class TableLocations:
    table_id: TableId
    tablets: tuple[TabletLocations, ...]
    """By partition key start."""
    ttl_ms: int
    """How long a client may cache them."""


@dataclass(frozen=True)
class TabletLocationsResult:
    locations: tuple[TabletLocations, ...] = ()
    errors: tuple[tuple[str, TesseraError], ...] = field(default=(), compare=False)
    """Per-id failures (unknown, deleted, replaced, not running), in request order."""


def resolve_table(maps: CatalogMaps, ident: TableIdentifier) -> TableInfo:
    """The live table `ident` names (checked), or NotFound naming it."""
    if ident.table_id is not None:
        info = maps.table(ident.table_id)
        if info is None:
            raise NotFound(f"table id {ident.table_id!r} not found")
        if info.is_removed:
            raise NotFound(f"table {info.name!r} ({info.table_id}) was deleted")
        if ident.name is not None and ident.name != info.name:
            raise NotFound(f"table id {info.table_id} is named {info.name!r}, not {ident.name!r}")
        return info
    assert ident.name is not None
    named = maps.live_table(ident.name)
    if named is None:
        raise NotFound(f"table {ident.name!r} not found")
    return named


def create_status(info: TableInfo) -> CreateTableStatus:
    live = info.live_tablets()
    running = sum(1 for t in live if t.state is TabletState.RUNNING)
    return CreateTableStatus(bool(live) and running == len(live), running, len(live))


def alter_status(info: TableInfo) -> AlterTableStatus:
    """Done when every RUNNING tablet's leader reported the table's schema version (tablets not
    created yet will be created with it)."""
    version = info.record.schema_version
    done = all(
        t.record.reported_schema_version >= version
        for t in info.live_tablets()
        if t.state is TabletState.RUNNING
    )
    return AlterTableStatus(done, version)


def list_tables(maps: CatalogMaps, name_filter: str) -> list[ListedTable]:
    """Live tables whose name contains `name_filter`, by name."""
    out = []
    for info in maps.live_tables():
        r = info.record
        if name_filter in r.name:
            out.append(
                ListedTable(
                    r.table_id,
                    r.name,
                    r.state,
                    r.schema_version,
                    r.num_replicas,
                    len(info.index),
                    r.owner,
                )
            )
    out.sort(key=lambda s: s.name)
    return out


def table_schema(info: TableInfo) -> TableSchemaInfo:
    r = info.record
    return TableSchemaInfo(
        r.table_id, r.name, r.schema, r.partition_schema, r.num_replicas, create_status(info).done
    )


def table_locations(
    info: TableInfo, start: bytes, end: bytes, limit: int, ttl_ms: int, address_of: AddressOf
) -> TableLocations:
    """At most `limit` tablets overlapping [start, end), from the one containing `start`."""
    resolver = _Resolver(address_of)
    out = [_running_locations(info, t, resolver) for t in info.index.overlapping(start, end, limit)]
    return TableLocations(info.table_id, tuple(out), ttl_ms)


def tablet_locations(
    maps: CatalogMaps, tablet_ids: Sequence[str], address_of: AddressOf
) -> TabletLocationsResult:
    """Locations of (checked, canonical, distinct) tablet ids, with per-id errors."""
    resolver = _Resolver(address_of)
    found: list[TabletLocations] = []
    errors: list[tuple[str, TesseraError]] = []
    for t in tablet_ids:
        tablet = maps.tablet(t)
        table = maps.table(tablet.table_id) if tablet is not None else None
        if tablet is None or table is None:
            errors.append((t, NotFound(f"tablet {t!r} not found")))
        elif tablet.state is TabletState.REPLACED:
            by = tablet.record.replaced_by
            errors.append((t, NotFound(f"tablet {t!r} was replaced by {by!r}")))
        elif tablet.state is TabletState.DELETED or table.is_removed:
            msg = tablet.record.state_msg or table.record.state_msg
            errors.append((t, NotFound(f"tablet {t!r} was deleted: {msg}")))
        else:
            try:
                found.append(_running_locations(table, tablet, resolver))
            except TabletNotRunning as e:
                errors.append((t, e))
    return TabletLocationsResult(tuple(found), tuple(errors))


def _running_locations(
    table: TableInfo, tablet: TabletInfo, resolver: _Resolver
) -> TabletLocations:
    if tablet.state is not TabletState.RUNNING:
        raise TabletNotRunning(
            f"tablet {tablet.tablet_id} of table {table.name!r} is {tablet.state.name}, "
            "not RUNNING yet; retry"
        )
    # The registry's current address wins (a re-registered server's new address); the record's
    # last known address only for a server the registry does not know (module docstring).
    served = tablet._served
    if served is not None:
        current = resolver.addresses(served[0])
        if served[1] == current:  # the same parsed address objects: an identity compare
            return served[2]
        uuids = served[0]
    else:
        uuids = tuple([r.ts_uuid for r in tablet.locations().replicas])
        current = resolver.addresses(uuids)
    loc = tablet.locations()
    if all(a is None or a == r.address for a, r in zip(current, loc.replicas, strict=True)):
        answer = loc  # every address as recorded: the memoized value itself
    else:
        answer = replace(
            loc,
            replicas=tuple(
                r if a is None or a == r.address else replace(r, address=a)
                for a, r in zip(current, loc.replicas, strict=True)
            ),
        )
    tablet._served = (uuids, current, answer)
    return answer
