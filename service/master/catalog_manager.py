"""The catalog manager: DDL and lookups over the copy-on-write catalog.

See docs/design/catalog.md (the catalog and its state-change contract) and
docs/design/coordinator.md (commit points, roll-forward, replay before serving).

Theory of operation
-------------------
Every state change follows the state-change contract (docs/design/catalog.md#R1..R7), in this
order:

  1. validate every field of the request; a bad one raises InvalidArgument (or NotFound,
     AlreadyExists, FailedPrecondition) with a message naming it, and nothing changes;
  2. take the locks (a table's before its tablets', tables in id order, tablets in id order:
     `catalog_info`), then read the committed records;
  3. build the new records (copy-on-write: new frozen values, nothing stored) and put the whole
     logical operation in ONE `CatalogWrite`, with a precondition on the version of every row
     it updates and the client's request id;
  4. replicate it (`replicate`, the master wires `RaftNode.propose`). If replication fails the
     operation fails with that error (NotTheLeader, Timeout: outcome unknown, Aborted), nothing
     in memory changed, the locks are released, and the master keeps running (KUDU-495);
     a refusal by sys.catalog (a stale precondition, a name taken meanwhile) is raised as its
     error class and likewise changed nothing;
  5. once applied, sys.catalog calls this manager's listener from the applying task, before
     `replicate` returns: the rows are committed into `CatalogMaps` (tablets before the table),
     the per-server replica counts pushed to the TSManager and the side-effect tasks updated.
     The same listener runs on followers, so their maps are warm when they are elected;
  6. return. Side effects on tablet servers (CreateTablet, DeleteTablet, AlterSchema) are not
     sent here: `pending_tasks()` lists them as values derived from committed state
     (`catalog_assignment`), for the background tasks to carry out and retry.

Choices (docs/design/catalog.md#R12):

* CreateTable writes the table RUNNING and its tablets PREPARING, in one entry. Kudu's
  PREPARING table state only ever existed between its two replications; with one entry and the
  maps updated after commit no reader can see it, so it is never written. A table is
  "create done" once every tablet of it is RUNNING (`is_create_table_done`).
* GetTableLocations fails with `TabletNotRunning` while a tablet in the range is not RUNNING,
  as Kudu's does (`catalog_info`, "Reads"); lookups are pure functions of the maps there.
* AlterTable with column steps writes the new schema (version + 1), the table ALTERING and the
  previous schema as `fully_applied_schema` (kept while an earlier alter is still being
  applied). A rename-only alter keeps the schema version. Renaming a key column rebinds the
  partition schema (columns are followed by id). The alter is done when every RUNNING tablet's
  leader reported the new version; ALTERING -> RUNNING is written by report processing.
* DeleteTable marks the table REMOVED and every live tablet DELETED in one entry; REPLACED
  tablets stay REPLACED. Records are kept forever (docs/design/catalog.md#R8); the name is free
  again.

Exactly-once DDL. Every DDL call carries a `RequestId`, stored in the entry with the response to
remember. A retry whose id sys.catalog remembers is answered from there without proposing
anything, also when it queued behind its original on the table lock (the id is checked again
under the lock); one racing its original into the log is answered at apply (`duplicate_of`).
So a client that lost the answer (a Timeout after the entry committed, a failover) gets the
original table id, not ALREADY_EXISTS or NOT_FOUND. Of two concurrent creates of one name on
this leader the second gets SERVICE_UNAVAILABLE while the first is in flight (Kudu's reserved
table names); its retry finds the name taken or, if the first failed, succeeds.

Readiness (replay before serving, docs/design/coordinator.md#R4). Until `load()` every call
raises `NotReady`. The
wiring calls `load()` on becoming leader once sys.catalog has applied everything up to the
leader's own no-op entry; `unload()` when it steps down. On a follower the master service
answers NotTheLeader before it reaches this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from random import Random
from typing import TypeAlias, cast

from service.common import failpoints
from service.common.clock import Clock
from service.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    NotReady,
    ResourceExhausted,
    ServiceUnavailable,
)
from service.common.ids import NodeId, TableId, TabletId, validate_uuid
from service.common.partition import PartitionSchema
from service.common.schema import (
    AlterOp,
    Schema,
)
from service.master.assigner import Assigner
from service.master.catalog_assignment import (
    AssignmentPlan,
    PendingTasks,
    Task,
    new_catalog_id,
)
from service.master.catalog_info import (
    CatalogMaps,
    MapsDelta,
    TableInfo,
    TabletInfo,
)
from service.master.catalog_reads import (
    AlterTableStatus,
    CreateTableStatus,
    ListedTable,
    TableIdentifier,
    TableLocations,
    TableSchemaInfo,
    TabletLocationsResult,
    alter_status,
    create_status,
    list_tables,
    registry_address_of,
    resolve_table,
    table_locations,
    table_schema,
    tablet_locations,
)
from service.master.catalog_records import (
    CatalogWrite,
    HostPort,
    Insert,
    Precondition,
    Record,
    RecordType,
    RequestId,
    RowKey,
    RowOp,
    TableRecord,
    TableState,
    TabletRecord,
    TabletState,
    Update,
)
from service.master.catalog_settings import CatalogSettings
from service.master.claims import ConfirmClaims
from service.master.ddl_checks import (
    check_alter_steps,
    check_num_replicas,
    check_owner,
    check_partitioning,
    check_request_id,
    check_schema,
    check_table_name,
    is_int,
)
from service.master.grants import GrantChange, grant_change_write, grant_deletes, grant_pb
from service.master.group_commit import GroupCommit
from service.master.locations_cache import LocationsCache
from service.master.report_handler import ReportHandler
from service.master.report_processing import (
    Answers,
    Claim,
    ReportedState,
    ReportedTablet,
    ReportPlan,
)
from service.master.rereplication import FailedReplicas
from service.master.sys_catalog import (
    ApplyResult,
    CatalogChange,
    Restored,
    Row,
    SysCatalogState,
)
from service.master.ts_manager import TSManager
from service.pb import master_pb2 as pb

__all__ = [
    "ALTER_TABLE",
    "CREATE_TABLE",
    "DELETE_TABLE",
    "CatalogManager",
    "Replicate",
]

log = logging.getLogger(__name__)

_ALIVE = frozenset((ReportedState.BOOTSTRAPPING, ReportedState.RUNNING, ReportedState.NOT_STARTED))
"""Reported states of a replica that is being created or serves (progress of a CREATING
tablet); FAILED, TOMBSTONED and the rest are not."""
_MAX_CACHED_KEY_BYTES = 1024
"""GetTableLocations answers for longer partition keys (start and end together) are not kept:
the cache is bounded in entries, and keys come from clients (real ones are a few bytes of hash
buckets and an encoded range key)."""

ENCODE_SLICE_OPS = 500
"""A write with more row operations than this is encoded in slices of this many, with the event
loop running between them (`_propose`): a 10,000-tablet CreateTable takes a few tenths of a
second of CPU to encode, seconds on a starved host, and in one piece on the loop that silenced
the leader's heartbeats past an election timeout. A slice is about 10 ms of CPU."""

CREATE_TABLE = "CreateTable"
ALTER_TABLE = "AlterTable"
DELETE_TABLE = "DeleteTable"

Replicate: TypeAlias = Callable[[bytes, float], Awaitable[ApplyResult]]
"""Propose one entry and wait until it is applied here: `RaftNode.propose(data, timeout)`."""


# --- the manager -----------------------------------------------------------------------------


class CatalogManager:
    """DDL and lookups of the master (module docstring). One event loop owns it; its
    collaborators `_assigner` (assignment rounds) and `_reports` (tablet reports) work on its
    maps and replicate through it, and it answers NotReady before it delegates to them.

    Invariants: `_maps` equals `CatalogMaps.rebuild(_sys)` whenever control is outside the
    listener, and `_assigner` works on the same maps (`_reload` hands it every rebuilt one)
    and follows every committed tablet (its own invariants: `assigner.Assigner`); `_tasks`
    holds the tasks committed state calls for on every tablet, on every master (done marks only
    while loaded, `pending_tasks` is empty otherwise); `_reserved_names` are
    names of creates and renames in flight.
    """

    def __init__(
        self,
        sys_catalog: SysCatalogState,
        replicate: Replicate,
        ts_manager: TSManager,
        clock: Clock,
        rng: Random,
        settings: CatalogSettings | None = None,
    ) -> None:
        self._settings = settings or CatalogSettings()
        self._settings.validate()
        self._replicate_fn = replicate
        self._ts = ts_manager
        self._registry_address_of = registry_address_of(ts_manager)  # no snapshot copy
        self._locations_cache = LocationsCache(self._settings.table_locations_cache_entries)
        self._clock = clock
        self._rng = rng
        self._loaded = False
        self._loaded_at = 0.0
        """When this manager last became ready as leader (clock seconds): the warm-up starts."""
        self._reserved_names: set[str] = set()
        self._tasks = PendingTasks()
        self._sys = sys_catalog
        self._maps = CatalogMaps()
        self._assigner = Assigner(
            self._maps,
            ts_manager,
            clock,
            rng,
            self._settings,
            replicate=self._replicate,
            address_of=self._address_of,
        )
        self._work_listeners: list[Callable[[], None]] = []
        self._report_writes = GroupCommit(self._propose)
        """Report writes proposed together share entries (group_commit.py)."""
        self._reports = ReportHandler(lambda: self._maps, self._replicate_report)
        self._reload()
        self._remove_listener = sys_catalog.add_listener(self._on_change)

    # --- readiness ---------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def maps(self) -> CatalogMaps:
        """The committed in-memory catalog (read it, never change it)."""
        return self._maps

    @property
    def settings(self) -> CatalogSettings:
        return self._settings

    @property
    def failed_replicas(self) -> FailedReplicas:
        """Replicas their servers report FAILED, as this leader heard (`note_replica_states`);
        empty while not loaded (read it, never change it)."""
        return self._reports.failed_replicas

    @property
    def report_writes(self) -> GroupCommit:
        """Report writes and the sys.catalog entries that carried them (for /metrics)."""
        return self._report_writes

    @property
    def locations_cache(self) -> LocationsCache:
        """GetTableLocations answers kept (for /metrics: hits, misses, entries)."""
        return self._locations_cache

    def load(self, sys_catalog: SysCatalogState | None = None) -> None:
        """Become ready to serve as leader. sys.catalog must have applied everything up to
        this leader's no-op entry.

        Nothing is rebuilt or recomputed: the listener keeps the maps equal to sys.catalog's
        rows and the tasks equal to what those rows call for on every master, leader or not
        (the class invariant), so a promotion costs the same at 200,000 tablets as at ten. A
        new leader only forgets what the last one heard: done marks (it sends every pending
        task again, roll-forward, docs/design/coordinator.md#R3), placement backoffs and
        reports. Only a different `sys_catalog` is rebuilt from.

        Why. A new leader must heartbeat its followers within the election timeout, on the
        same loop. Rebuilding the maps and every tablet's tasks at once took 2.2-3.4 s at
        95,000 tablets, longer than the 1.5 s election timeout, and the masters flapped; with
        warm maps the tasks alone still took 0.85-1.2 s of the loop at 200,000 tablets, in the
        first second of the term, while the first client lookups waited behind them."""
        if sys_catalog is not None and sys_catalog is not self._sys:
            self._remove_listener()
            self._sys = sys_catalog
            self._remove_listener = sys_catalog.add_listener(self._on_change)
            self._reload()
        self._loaded = True
        self._loaded_at = self._clock.now()
        self._assigner.clear_backoffs()
        self._reports.clear()  # rebuilt by the full reports a new leader asks for
        self._tasks.forget_done()
        log.info(
            "catalog loaded at index %d: %d tables, %d tablets, %d pending tasks",
            self._sys.applied_index,
            len(self._maps.tables_by_id),
            len(self._maps.tablets_by_id),
            len(self._tasks),
        )
        if len(self._tasks):
            self._wake()

    def unload(self) -> None:
        """Stop serving (leadership lost). The maps stay warm through the listener."""
        self._loaded = False
        self._tasks.forget_done()
        self._assigner.clear_backoffs()
        self._reports.clear()
        self._locations_cache.clear()

    def close(self) -> None:
        """Detach from sys.catalog."""
        self.unload()
        self._remove_listener()

    def _check_ready(self) -> None:
        if not self._loaded:
            raise NotReady("the catalog is not loaded yet (a new leader replays first); retry")

    # --- DDL ---------------------------------------------------------------------------------

    async def create_table(
        self,
        name: str,
        schema: Schema,
        partition_schema: PartitionSchema,
        num_replicas: int,
        request_id: RequestId,
        owner: str = "",
    ) -> TableId:
        """Create a table and all its tablets in ONE replicated entry; returns its id.

        `schema`'s column ids and version are assigned here (ids in column order, version 0).
        `num_replicas` 0 means the default. A retry of `request_id` gets the original id.
        """
        self._check_ready()
        req = check_request_id(request_id)
        done = self._remembered(req, CREATE_TABLE)
        if done is not None:
            return TableId(pb.CreateTableResponsePB.FromString(done).table_id)
        name = check_table_name(name, "name")
        schema = check_schema(schema)
        partitions = check_partitioning(partition_schema, schema)
        replicas = check_num_replicas(
            num_replicas, self._settings.default_num_replicas, self._settings.max_num_replicas
        )
        owner = check_owner(owner, self._settings.max_owner_bytes)
        live = self._ts.num_live()
        if replicas > live:
            problem = (
                f"num_replicas {replicas}: need {replicas} live tablet servers, have {live}"
                f" ({len(self._ts)} registered)"
            )
            led = self._clock.now() - self._loaded_at
            if led < self._settings.leader_warmup_s:
                # A new leader's registry fills as servers find it (some backed off from it
                # while it restarted): a retry soon may succeed (leader_warmup_ms).
                raise NotReady(
                    f"{problem}; this master became leader {led:.1f}s ago and tablet servers "
                    "are still registering: retry"
                )
            raise FailedPrecondition(problem)
        limit = self._settings.max_create_tablets_per_ts * live
        if len(partitions) > limit:
            raise InvalidArgument(
                f"partition_schema: makes {len(partitions)} tablets, more than the {limit} "
                f"allowed at creation ({self._settings.max_create_tablets_per_ts} per live "
                f"tablet server x {live})"
            )
        self._check_name_free(name)
        now_us = self._now_us()
        table_id = TableId(new_catalog_id(self._rng))
        table = TableRecord(
            table_id=table_id,
            name=name,
            schema=schema,
            partition_schema=partition_schema,
            state=TableState.RUNNING,
            num_replicas=replicas,
            created_time_us=now_us,
            altered_time_us=now_us,
            owner=owner,
        )
        ops: list[RowOp] = [Insert(table)]
        for p in partitions:
            tablet_id = TabletId(new_catalog_id(self._rng))
            tablet = TabletRecord(tablet_id, table_id, p, TabletState.PREPARING)
            ops.append(Insert(replace(tablet, created_time_us=now_us)))
        write = CatalogWrite(
            ops=tuple(ops),
            expected=(Precondition.absent(RowKey(RecordType.TABLE, table_id)),),
            request_id=req,
            operation=CREATE_TABLE,
            response=pb.CreateTableResponsePB(table_id=table_id).SerializeToString(),
        )
        self._reserved_names.add(name)
        try:
            failpoints.hit("create_table:before_replicate")
            result = await self._replicate(write)
        finally:
            self._reserved_names.discard(name)
        failpoints.hit("create_table:after_replicate")
        return TableId(pb.CreateTableResponsePB.FromString(result.response).table_id)

    async def alter_table(
        self,
        table: TableIdentifier,
        ops: Sequence[AlterOp],
        request_id: RequestId,
        *,
        new_name: str | None = None,
        expected_schema_version: int | None = None,
    ) -> int:
        """Apply column steps and/or a rename as ONE entry; returns the schema version after.

        `expected_schema_version`: refuse (FailedPrecondition) unless the table is at it.
        """
        self._check_ready()
        req = check_request_id(request_id)
        done = self._remembered(req, ALTER_TABLE)
        if done is not None:
            return pb.AlterTableResponsePB.FromString(done).schema_version
        steps = check_alter_steps(ops)
        if new_name is not None:
            new_name = check_table_name(new_name, "new_name")
        expected = expected_schema_version
        if expected is not None and (not is_int(expected) or expected < 0):
            raise InvalidArgument(f"expected_schema_version: must be an int >= 0, got {expected!r}")
        if not steps and new_name is None:
            raise InvalidArgument("alter has no operations: give column steps and/or a new name")
        info = self._resolve(table)
        async with info.lock.exclusive():
            done = self._remembered(req, ALTER_TABLE)  # a retry that queued behind its original
            if done is not None:
                return pb.AlterTableResponsePB.FromString(done).schema_version
            if info.is_removed:
                raise NotFound(f"table {info.name!r} ({info.table_id}) was deleted")
            row = info.row
            old = row.record
            if expected is not None and old.schema_version != expected:
                raise FailedPrecondition(
                    f"table {old.name!r} is at schema version {old.schema_version}, not the "
                    f"expected {expected}"
                )
            schema, partition_schema = old.schema, old.partition_schema
            if steps:
                try:
                    schema = old.schema.apply(steps)
                except InvalidArgument as e:
                    raise InvalidArgument(f"table {old.name!r}: {e.message}") from None
                partition_schema = old.partition_schema.rebind(old.schema, schema)
            name = old.name
            if new_name is not None and new_name != old.name:
                self._check_name_free(new_name)
                name = new_name
            if not steps and name == old.name:
                raise InvalidArgument(f"alter changes nothing: the table is named {name!r}")
            new = replace(
                old,
                name=name,
                schema=schema,
                partition_schema=partition_schema,
                altered_time_us=max(self._now_us(), old.created_time_us),
                state=TableState.ALTERING if steps else old.state,
                fully_applied_schema=(
                    (old.fully_applied_schema or old.schema) if steps else old.fully_applied_schema
                ),
            )
            response = pb.AlterTableResponsePB(table_id=old.table_id, schema_version=schema.version)
            write = CatalogWrite(
                ops=(Update(new),),
                expected=(Precondition(row.key, row.version),),
                request_id=req,
                operation=ALTER_TABLE,
                response=response.SerializeToString(),
            )
            renamed = name != old.name
            if renamed:
                self._reserved_names.add(name)
            try:
                failpoints.hit("alter_table:before_replicate")
                result = await self._replicate(write)
            finally:
                if renamed:
                    self._reserved_names.discard(name)
        failpoints.hit("alter_table:after_replicate")
        return pb.AlterTableResponsePB.FromString(result.response).schema_version

    async def delete_table(self, table: TableIdentifier, request_id: RequestId) -> TableId:
        """Mark the table REMOVED and its live tablets DELETED in ONE entry; returns its id.
        The records stay; the name is free once this returns."""
        self._check_ready()
        req = check_request_id(request_id)
        done = self._remembered(req, DELETE_TABLE)
        if done is not None:
            return TableId(pb.DeleteTableResponsePB.FromString(done).table_id)
        info = self._resolve(table)
        async with info.lock.exclusive(), contextlib.AsyncExitStack() as stack:
            done = self._remembered(req, DELETE_TABLE)  # a retry that queued behind its original
            if done is not None:
                return TableId(pb.DeleteTableResponsePB.FromString(done).table_id)
            if info.is_removed:
                raise NotFound(f"table {info.name!r} ({info.table_id}) was deleted")
            tablets = [info.tablets[t] for t in sorted(info.tablets)]
            for tablet in tablets:
                await stack.enter_async_context(tablet.lock)
            row = info.row
            msg = f"table {row.record.name!r} deleted at {self._now_us()} us"
            ops: list[RowOp] = [
                Update(replace(row.record, state=TableState.REMOVED, state_msg=msg))
            ]
            expected = [Precondition(row.key, row.version)]
            for tablet in tablets:
                if tablet.state.is_terminal:
                    continue
                ops.append(Update(replace(tablet.record, state=TabletState.DELETED, state_msg=msg)))
                expected.append(Precondition(tablet.row.key, tablet.version))
            # Its grants go with it: a later table of the same name starts with none.
            grant_ops, grant_expected = grant_deletes(self._sys.grants_of(info.table_id))
            ops += grant_ops
            expected += grant_expected
            write = CatalogWrite(
                ops=tuple(ops),
                expected=tuple(expected),
                request_id=req,
                operation=DELETE_TABLE,
                response=pb.DeleteTableResponsePB(table_id=info.table_id).SerializeToString(),
            )
            failpoints.hit("delete_table:before_replicate")
            result = await self._replicate(write)
        failpoints.hit("delete_table:after_replicate")
        return TableId(pb.DeleteTableResponsePB.FromString(result.response).table_id)

    async def change_grant(
        self, table: TableIdentifier, change: GrantChange, request_id: RequestId
    ) -> pb.GrantPB:
        """Grant or revoke privileges of one user on one live table, exactly once per request
        id (service/master/grants.py); returns what the user holds afterwards."""
        self._check_ready()
        req = check_request_id(request_id)
        done = self._remembered(req, change.operation)
        if done is None:
            info = self._resolve(table)
            async with info.lock.exclusive():
                done = self._remembered(req, change.operation)
                if done is None:
                    if info.is_removed:
                        raise NotFound(f"table {info.name!r} ({info.table_id}) was deleted")
                    current = self._sys.grant(info.table_id, change.user)
                    write = grant_change_write(info.table_id, info.name, current, change, req)
                    done = (await self._replicate(write)).response
        return pb.GrantPrivilegesResponsePB.FromString(done).grant

    def list_grants(self, table_name: str = "", user: str = "") -> list[pb.GrantPB]:
        """Grants on live tables, by table name then user, optionally of one table or user."""
        self._check_ready()
        out = []
        for row in self._sys.grants():
            g = row.record
            info = self._maps.tables_by_id.get(g.table_id)
            if info is None or info.is_removed:
                continue
            if (table_name and info.name != table_name) or (user and g.user != user):
                continue
            out.append(grant_pb(g.table_id, info.name, g.user, g.privileges))
        out.sort(key=lambda p: (p.table_name, p.user))
        return out

    # --- reads -------------------------------------------------------------------------------

    async def is_create_table_done(self, table: TableIdentifier) -> CreateTableStatus:
        self._check_ready()
        return create_status(self._resolve(table))

    async def is_alter_table_done(self, table: TableIdentifier) -> AlterTableStatus:
        """Done when every RUNNING tablet's leader reported the table's schema version."""
        self._check_ready()
        return alter_status(self._resolve(table))

    async def list_tables(self, name_filter: str = "") -> list[ListedTable]:
        """Live tables whose name contains `name_filter`, by name."""
        self._check_ready()
        if not isinstance(name_filter, str):
            raise InvalidArgument(f"name_filter: must be a string, got {name_filter!r}")
        return list_tables(self._maps, name_filter)

    def table_identity(self, table: TableIdentifier) -> tuple[str, str]:
        """The table's (id, current name) (NotFound if there is none): O(1), for checks that
        need only which table a request names, on every lookup (`table_schema` counts the
        table's RUNNING tablets)."""
        self._check_ready()
        info = self._resolve(table)
        return info.table_id, info.name

    async def get_table_schema(self, table: TableIdentifier) -> TableSchemaInfo:
        self._check_ready()
        return table_schema(self._resolve(table))

    async def get_table_locations(
        self,
        table: TableIdentifier,
        partition_key_start: bytes = b"",
        partition_key_end: bytes = b"",
        max_tablets: int = 0,
    ) -> TableLocations:
        """The tablets overlapping [start, end) (b"" end: to the end), at most `max_tablets`
        (0: the default), from the one containing `start`, with replicas from their committed
        consensus state. TabletNotRunning if one of them is not RUNNING yet."""
        self._check_ready()
        if not isinstance(partition_key_start, bytes):
            raise InvalidArgument("partition_key_start: must be bytes")
        if not isinstance(partition_key_end, bytes):
            raise InvalidArgument("partition_key_end: must be bytes")
        if partition_key_end and partition_key_start > partition_key_end:
            raise InvalidArgument(
                f"partition_key_start 0x{partition_key_start.hex()} is above "
                f"partition_key_end 0x{partition_key_end.hex()}"
            )
        if not is_int(max_tablets) or max_tablets < 0:
            raise InvalidArgument(f"max_tablets: must be an integer >= 0, got {max_tablets!r}")
        limit = max_tablets or self._settings.default_max_returned_locations
        info = self._resolve(table)
        # The same object while nothing it was built from changed (locations_cache).
        key = (info.table_id, partition_key_start, partition_key_end, limit)
        addresses = self._ts.addresses_version
        cached = self._locations_cache.get(key, info, addresses)
        if cached is not None:
            return cached
        answer = table_locations(
            info,
            partition_key_start,
            partition_key_end,
            limit,
            self._settings.table_locations_ttl_ms,
            self._address_of,
        )
        if len(partition_key_start) + len(partition_key_end) <= _MAX_CACHED_KEY_BYTES:
            self._locations_cache.put(key, info, addresses, answer)
        return answer

    async def get_tablet_locations(self, tablet_ids: Sequence[str]) -> TabletLocationsResult:
        """Locations by tablet id; unknown, deleted, replaced or not-running ids are reported
        per id in `errors`. Malformed or duplicate ids fail the whole call."""
        self._check_ready()
        if isinstance(tablet_ids, str | bytes) or not isinstance(tablet_ids, Iterable):
            raise InvalidArgument("tablet_ids: must be a list of tablet ids")
        ids = list(tablet_ids)
        if not ids:
            raise InvalidArgument("tablet_ids: empty")
        cap = self._settings.max_tablet_ids_per_request
        if len(ids) > cap:
            raise InvalidArgument(f"tablet_ids: {len(ids)} ids, more than {cap} per request")
        canonical: list[str] = []
        for i, raw in enumerate(ids):
            try:
                t = validate_uuid(raw)
            except InvalidArgument as e:
                raise InvalidArgument(f"tablet_ids[{i}]: {e.message}") from None
            if t in canonical:
                raise InvalidArgument(f"tablet_ids[{i}]: tablet {t!r} asked for twice")
            canonical.append(t)
        return tablet_locations(self._maps, canonical, self._address_of)

    async def dump(self, include_removed: bool = False) -> tuple[int, list[Row[Record]]]:
        """Every table row and its tablets' rows as of one applied index (the
        catalog the leader serves, docs/design/catalog.md#R10). The rows are taken in one
        synchronous step of C-level copies, so no entry applies in the middle; they are
        immutable values, so each table's are sorted afterwards with a turn of the loop between
        tables (in one piece, 200,000 tablets held a starved leader's loop past an election
        timeout). REMOVED tables (and their tablets) only with `include_removed`. Never the CA
        or the keys."""
        self._check_ready()
        tables = self._sys.tables(include_removed=include_removed)
        view = self._sys.tablets_view()
        rows: list[Row[Record]] = []
        for table in tables:
            rows.append(cast(Row[Record], table))
            rows.extend(cast(list[Row[Record]], view.tablets_of(table.record.table_id)))
            await asyncio.sleep(0)
        return view.applied_index, rows

    def _address_of(self, uuid: str) -> HostPort | None:
        return self._registry_address_of(uuid)

    # --- assignment rounds (assigner.Assigner; NotReady until loaded) -------------------------

    def plan_assignments(
        self, now: float | None = None, tables: Collection[TableId] | None = None
    ) -> AssignmentPlan:
        """What one assignment round would write now, without writing it
        (`Assigner.plan_assignments`)."""
        self._check_ready()
        return self._assigner.plan_assignments(now, tables)

    def assignment_due(self, now: float | None = None) -> bool:
        """A round has something to do (`Assigner.assignment_due`); never while not loaded."""
        return self._loaded and self._assigner.assignment_due(now)

    def next_assignment_at(self) -> float | None:
        """When the background loop should look again at the latest (`Assigner`)."""
        return self._assigner.next_assignment_at()

    async def assign_tablets(
        self, now: float | None = None, *, max_tablets: int | None = None
    ) -> AssignmentPlan:
        """One bounded assignment round, replicated (`Assigner.assign_tablets`); the
        background tasks call it."""
        self._check_ready()
        return await self._assigner.assign_tablets(now, max_tablets=max_tablets)

    def create_started(self, tablet_id: TabletId) -> None:
        """The CreateTablet calls of CREATING `tablet_id` are going out for the first time: its
        assignment timeout runs from now (`Assigner.create_started`)."""
        self._assigner.create_started(tablet_id)

    def creation_progress(self, tablet_id: TabletId, server: NodeId, answered: bool) -> None:
        """`server` answered CreateTablet of CREATING `tablet_id` (`answered`) or refused it as
        busy: its replacement timer starts again (`Assigner.creation_progress`)."""
        self._assigner.creation_progress(tablet_id, server, answered)

    def creation_call(self, tablet_id: TabletId, started: bool, deadline: float = 0.0) -> None:
        """A CreateTablet call of CREATING `tablet_id` went out or ended
        (`Assigner.creation_call`)."""
        self._assigner.creation_call(tablet_id, started, deadline)

    def creation_paused(self, tablet_id: TabletId) -> None:
        """`Assigner.creation_paused`."""
        self._assigner.creation_paused(tablet_id)

    @property
    def assigner(self) -> Assigner:
        """The assignment state (replacement counters for /metrics)."""
        return self._assigner

    # --- tasks -------------------------------------------------------------------------------

    def pending_tasks(self) -> list[Task]:
        """Side effects committed state calls for and not yet reported done (`task_done`); none
        while not loaded (the tasks are kept warm, but only a leader carries them out)."""
        return self._tasks.pending() if self._loaded else []

    def task_pending(self, task: Task) -> bool:
        """`task` is still called for and not done (cheap: one lookup); never while not
        loaded."""
        return self._loaded and self._tasks.is_pending(task)

    def add_work_listener(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call `fn` (which must not block) whenever committed state may call for new tasks or
        assignments (the background tasks' wake-up); returns the remover."""
        self._work_listeners.append(fn)
        return lambda: self._work_listeners.remove(fn) if fn in self._work_listeners else None

    def _wake(self) -> None:
        for fn in list(self._work_listeners):
            try:
                fn()
            except Exception:
                log.exception("catalog work listener failed")

    def task_done(self, task: Task) -> None:
        """The background task carried `task` out. It is not listed again unless committed
        state calls for it anew (or a new leader forgets every done mark)."""
        self._tasks.done(task)

    # --- tablet reports (report_handler.ReportHandler; NotReady until loaded) -----------------

    def note_replica_states(
        self, reporter: NodeId, reported: Sequence[ReportedTablet], *, full: bool
    ) -> None:
        """Learn which of `reporter`'s replicas are FAILED from one of its reports (leader
        only; not replicated: `rereplication.FailedReplicas`). A newly FAILED replica wakes
        the background tasks, which replace it."""
        if not self._loaded:
            return
        creating = self._assigner.creating
        if creating:
            # A replica of a CREATING tablet reporting it is progress (create_pacing).
            for r in reported:
                if r.tablet_id in creating and r.state in _ALIVE:
                    cs = self._maps.tablets_by_id[r.tablet_id].record.consensus
                    if cs is not None and cs.peer(reporter) is not None:
                        self._assigner.creation_progress(r.tablet_id, reporter, True)
        if self._reports.note_replica_states(reporter, reported, full=full):
            self._wake()

    def creating_tablets(self) -> AbstractSet[TabletId]:
        """The CREATING tablets (empty while not loaded): a report naming one of them turns
        it RUNNING, so a heartbeat reads at least those entries of a report it otherwise
        sheds (`heartbeat.handle_heartbeat`)."""
        return self._assigner.creating if self._loaded else frozenset()

    def judge_report(self, reporter: NodeId, reported: Sequence[ReportedTablet]) -> ReportPlan:
        """The report judged against committed state without writing anything: when its plan
        has no write (a steady server's report: nothing changed), it is the whole answer and
        `process_report` need not run."""
        self._check_ready()
        return self._reports.judge_report(reporter, reported)

    def claims_to_ask(self, claims: Sequence[Claim]) -> list[Claim]:
        """The unconfirmed claims whose voters the leader should ask now (claims.py)."""
        self._check_ready()
        return self._reports.claims_to_ask(claims)

    def note_answers(self, answers: Mapping[TabletId, Answers]) -> None:
        """Servers' answers to GetConsensusState about claimed tablets (claims.py)."""
        if self._loaded:
            self._reports.note_answers(answers)

    def pending_claims(self) -> int:
        """Membership claims waiting for their voters' confirmation (claims.py); 0 unless
        loaded."""
        return self._reports.claims.pending_claims if self._loaded else 0

    async def settle_claims(self, confirm: ConfirmClaims) -> list[ReportPlan]:
        """One sweep of the pending membership claims: their voters asked, confirmed ones
        adopted (`ReportHandler.settle_claims`, claims.py); the plans that wrote, whose
        actions the caller sends."""
        self._check_ready()
        return await self._reports.settle_claims(confirm)

    async def process_report(
        self,
        reporter: NodeId,
        reported: Sequence[ReportedTablet],
        judged: ReportPlan | None = None,
    ) -> ReportPlan:
        """Judge one tablet report under its tables' and tablets' locks and replicate its
        record changes as ONE write (`ReportHandler.process_report`); the caller sends the
        plan's `actions` once this returns."""
        self._check_ready()
        return await self._reports.process_report(reporter, reported, judged)

    # --- replication -------------------------------------------------------------------------

    async def _replicate(self, write: CatalogWrite) -> ApplyResult:
        """Propose `write` and wait until applied (and so committed in memory, by the
        listener). A refusal is raised as its error; replication errors propagate."""
        result = await self._propose(write)
        result.raise_for_refusal()
        return result

    async def _replicate_report(self, write: CatalogWrite) -> ApplyResult:
        """`_replicate` for a tablet report's write, which may share its entry with other
        reports' (`GroupCommit`)."""
        result = await self._report_writes.replicate(write)
        result.raise_for_refusal()
        return result

    async def _propose(self, write: CatalogWrite) -> ApplyResult:
        """Propose `write` as one entry and wait until applied; a refusal is in the result.
        ResourceExhausted, before anything is proposed, for an entry over the size limit."""
        if len(write.ops) > ENCODE_SLICE_OPS:
            # In slices on the loop, not in a worker thread: a CPU-bound thread wins the GIL
            # from the loop every time the loop blocks in a system call, and on a starved host
            # the loop got 0.02 s of CPU in 0.55 s while the thread encoded (its followers
            # elected a new leader). Between slices the loop ticks, heartbeats and answers.
            parts = []
            for part in write.encode_parts(ENCODE_SLICE_OPS):
                parts.append(part)
                await asyncio.sleep(0)
            data = b"".join(parts)
        else:
            data = write.encode()
        if len(data) > self._settings.max_write_bytes:
            raise ResourceExhausted(
                f"{write.operation or 'catalog write'}: the entry would be {len(data)} bytes, "
                f"more than the {self._settings.max_write_bytes} allowed"
            )
        return await self._replicate_fn(data, self._settings.replicate_timeout_s)

    def _remembered(self, req: RequestId, operation: str) -> bytes | None:
        found = self._sys.remembered(req.client_id, req.seq_no)
        if found is None:
            return None
        if found.operation != operation:
            raise InvalidArgument(
                f"request id {req} was used for {found.operation or 'another operation'}, "
                f"not {operation}"
            )
        return found.response

    # --- the listener: commit in memory, then follow-ups -------------------------------------

    def _on_change(self, change: CatalogChange) -> None:
        if isinstance(change, Restored):
            self._reload()
            return
        try:
            delta = self._maps.on_applied(change)
        except Exception:
            log.exception(
                "catalog maps: entry %d did not commit in memory; rebuilding", change.index
            )
            self._reload()
            return
        self._follow_up(delta)

    def _reload(self) -> None:
        self._maps = CatalogMaps.rebuild(self._sys)
        self._locations_cache.clear()  # built from the old maps' objects: never current again
        self._ts.replace_replica_counts(self._maps.replica_counts())
        self._assigner.reset(self._maps)
        self._tasks.clear()
        for tablet in self._maps.tablets_by_id.values():
            self._update_tasks(tablet)
        if self._loaded:
            self._wake()

    def _follow_up(self, delta: MapsDelta) -> None:
        for uuid in delta.servers:
            self._ts.set_replica_counts(uuid, self._maps.replica_counts_of(uuid))
        self._assigner.note_committed(delta.tablets)
        affected: dict[TabletId, None] = {new.tablet_id: None for _, new in delta.tablets}
        for old_t, new_t in delta.tables:
            if old_t is not None and (
                old_t.schema_version != new_t.schema_version or old_t.is_removed != new_t.is_removed
            ):
                table = self._maps.tables_by_id[new_t.table_id]
                affected.update(dict.fromkeys(table.tablets))
        # Wake the background tasks only for new work (a task, a tablet to assign): reports
        # that merely finish tasks would otherwise run a full round per committed report.
        work = any(new.state is TabletState.PREPARING for _, new in delta.tablets)
        for tablet_id in affected:
            work = self._update_tasks(self._maps.tablets_by_id[tablet_id]) or work
        if work and self._loaded:
            self._wake()

    def _update_tasks(self, tablet: TabletInfo) -> bool:
        table = self._maps.tables_by_id.get(tablet.table_id)
        return self._tasks.update(tablet.record, table.record if table is not None else None)

    # --- validation helpers that need settings or state --------------------------------------

    def _check_name_free(self, name: str) -> None:
        holder = self._maps.live_table(name)
        if holder is not None:
            raise AlreadyExists(f"table name {name!r} is taken by table {holder.table_id}")
        if name in self._reserved_names:
            raise ServiceUnavailable(
                f"table name {name!r} is reserved by a CreateTable or AlterTable in progress; retry"
            )

    def _resolve(self, table: object) -> TableInfo:
        return resolve_table(self._maps, TableIdentifier.checked(table))

    def _now_us(self) -> int:
        return int(self._clock.now() * 1_000_000)
