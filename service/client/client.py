"""`TesseraClient`: the async client library (catalog admin, writes, scans, scan tokens).

One client per process is the intended use: it owns one gRPC channel per server
(`ChannelPool`), the leader-master connection with its request ids (`MasterClient`), and the
location cache (`MetaCache`); write sessions and scanners borrow them. `SyncClient`
(`service.client.sync`) wraps it for code that is not async, such as Spark executors.

Read-your-writes: the client remembers, per tablet, the highest Raft index its writes were
applied at (`note_applied`) and asks every later scan of that tablet to wait for it
(`min_applied_index`), so a follower chosen by `closest` never returns a state older than the
client's own acknowledged writes.

Splitting a scan (`split_token`, kudu-spark's splitSizeBytes) asks one replica of the tablet
for split keys (the SplitKeyRange RPC): the tablet server picks them from the keys it holds
sorted, so planning reads no rows. Any replica may answer; the next one is tried when one is
unavailable.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

import pyarrow as pa

from service.client.channels import ChannelPool
from service.client.master_client import MasterClient
from service.client.meta_cache import MetaCache, TableHandle, TabletLocation
from service.client.pruning import prune
from service.client.retry import Backoff, Deadline
from service.client.scanner import ScanToken, TabletScanner, TokenReplica, order_replicas
from service.client.transactions import Transaction, TransactionScope, TransactionState
from service.client.write_session import RequestIds, WriteResult, WriteSession
from service.common.errors import (
    Internal,
    InvalidArgument,
    NotFound,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    WrongDestination,
)
from service.common.hybrid_time import from_micros
from service.common.partition import PartitionSchema
from service.common.predicates import (
    IS_DELETED,
    ColumnPredicate,
    ScanSpec,
    predicate_to_pb,
    validate_spec,
)
from service.common.schema import AddColumn, DropColumn, RenameColumn, Schema
from service.common.schema_codec import column_to_pb, partition_schema_to_pb, schema_to_pb
from service.common.tls import Credentials
from service.common.tokens import Privilege
from service.pb import master_pb2 as pb
from service.pb import tserver_pb2 as tpb

__all__ = [
    "CatalogDump",
    "Grant",
    "KeyRangeSplit",
    "MasterInfo",
    "TableSummary",
    "TabletServerInfo",
    "TesseraClient",
]

AlterStep = AddColumn | DropColumn | RenameColumn


@dataclass(frozen=True)
class TableSummary:
    table_id: str
    name: str
    state: str
    schema_version: int
    num_replicas: int
    num_tablets: int


@dataclass(frozen=True)
class Grant:
    """The privileges `user` holds on one table ("read", "write", "alter")."""

    table_id: str
    table_name: str
    user: str
    privileges: tuple[str, ...]

    @classmethod
    def from_pb(cls, g: pb.GrantPB) -> Grant:
        names = tuple(
            pb.PrivilegePB.Name(p).removeprefix("PRIVILEGE_").lower() for p in g.privileges
        )
        return cls(g.table_id, g.table_name, g.user, names)


def _privileges_pb(privileges: Sequence[str]) -> list[pb.PrivilegePB.ValueType]:
    return [
        pb.PrivilegePB.Value("PRIVILEGE_" + Privilege.parse(p).value.upper()) for p in privileges
    ]


@dataclass(frozen=True)
class TabletServerInfo:
    uuid: str
    address: str
    live: bool
    millis_since_heartbeat: int
    num_replicas: int
    num_leaders: int
    location: str


@dataclass(frozen=True)
class CatalogDump:
    """The catalog as of one committed index (DumpCatalog): table and tablet records."""

    committed_index: int
    tables: list[pb.TableRecordPB]
    tablets: list[pb.TabletRecordPB]


@dataclass(frozen=True)
class MasterInfo:
    uuid: str
    address: str
    role: str
    term: int
    committed_index: int
    error: str
    member_type: str = "VOTER"
    """VOTER or NON_VOTER (a master added and still catching up)."""


@dataclass(frozen=True)
class KeyRangeSplit:
    """A tablet server's SplitKeyRange answer for a token's [lower_key, upper_key): the split
    keys (strictly increasing, strictly inside) cut it into len(split_keys) + 1 chunks, whose
    estimated live rows and bytes (of the token's projection) are in key order."""

    split_keys: tuple[bytes, ...]
    chunk_rows: tuple[int, ...]
    chunk_bytes: tuple[int, ...]
    ts_uuid: str
    """The replica that answered."""
    applied_index: int


_SPLIT_FAIL_OVER = (ServiceUnavailable, Timeout, WrongDestination, NotFound)
"""SplitKeyRange errors after which another replica may answer (down, not running, moved)."""


def _checked_split(token: ScanToken, ts_uuid: str, r: tpb.SplitKeyRangeResponsePB) -> KeyRangeSplit:
    """The answer as a value, once checked: a bad split would make pieces overlap or miss rows."""
    keys = tuple(r.split_keys)
    lo, hi = token.lower_key, token.upper_key
    ok = all(a < b for a, b in itertools.pairwise(keys)) and len(r.chunks) == len(keys) + 1
    if keys:
        ok = ok and keys[0] > lo and (not hi or keys[-1] < hi)
    if not ok:
        raise Internal(
            f"SplitKeyRange of tablet {token.tablet_id} on {ts_uuid}: split keys not strictly "
            f"increasing inside the range, or {len(r.chunks)} chunks for {len(keys)} keys"
        )
    return KeyRangeSplit(
        keys,
        tuple(c.estimated_rows for c in r.chunks),
        tuple(c.estimated_bytes for c in r.chunks),
        ts_uuid,
        r.applied_index,
    )


def _hp(h: pb.HostPortPB) -> str:
    return f"{h.host}:{h.port}"


class TesseraClient:
    """The async client. `async with TesseraClient(["host:port", ...]) as c: ...`"""

    def __init__(
        self,
        masters: Sequence[str],
        *,
        timeout: float = 30.0,
        client_id: str | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.masters = tuple(masters)
        self.timeout = timeout
        self.credentials = credentials
        """Mutual TLS with this certificate (a secured cluster); None: plaintext."""
        self.channels = ChannelPool(credentials)
        self.master = MasterClient(self.masters, self.channels, client_id=client_id)
        self.meta = MetaCache(self.master)
        self._applied: dict[str, int] = {}
        self.latest_timestamp = 0
        """The newest hybrid timestamp this client has seen (a write's commit, a snapshot's
        time): sent with its writes and scans, so what it does next is ordered after it
        (read-your-writes for snapshot reads, docs/design/tablets.md#R4)."""
        self._transactions: weakref.WeakSet[Transaction] = weakref.WeakSet()
        """Open transactions: their keep-alives stop when the client closes."""
        self.request_ids = RequestIds()
        """Names of this client's write requests: a retried batch is applied once."""

    async def aclose(self) -> None:
        for txn in list(self._transactions):
            txn.stop_keepalive()
        await self.master.aclose()
        await self.channels.aclose()

    async def __aenter__(self) -> TesseraClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def _t(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout

    # --- catalog -----------------------------------------------------------------------------

    async def create_table(
        self,
        name: str,
        schema: Schema,
        partition_schema: PartitionSchema,
        *,
        num_replicas: int = 0,
        wait: bool = True,
        timeout: float | None = None,
    ) -> str:
        """Create a table; with `wait`, return once every tablet is RUNNING. The table id."""
        deadline = Deadline.after(self._t(timeout))
        req = pb.CreateTableRequestPB(
            name=name,
            schema=schema_to_pb(schema),
            partition_schema=partition_schema_to_pb(partition_schema, schema),
            num_replicas=num_replicas,
        )
        r = await self.master.ddl("CreateTable", req, deadline.remaining())
        if wait:
            await self._wait_done(
                "IsCreateTableDone", pb.IsCreateTableDoneRequestPB, r.table_id, deadline
            )
        return str(r.table_id)

    async def _wait_done(
        self, method: str, req_type: type, table_id: str, deadline: Deadline
    ) -> None:
        backoff = Backoff(initial=0.05, cap=0.5)
        while True:
            done = await self.master.call(
                method,
                req_type(table=pb.TableIdentifierPB(table_id=table_id)),
                deadline.remaining(),
            )
            if done.done:
                return
            try:
                await backoff.sleep(deadline)
            except Timeout:
                raise Timeout(
                    f"{method} for table {table_id}: not done before the deadline"
                ) from None

    async def alter_table(
        self,
        name: str,
        steps: Sequence[AlterStep] = (),
        *,
        new_name: str | None = None,
        expected_schema_version: int | None = None,
        wait: bool = True,
        timeout: float | None = None,
    ) -> int:
        """Apply `steps` (one new schema version) and/or rename; the new schema version."""
        deadline = Deadline.after(self._t(timeout))
        req = pb.AlterTableRequestPB(table=pb.TableIdentifierPB(table_name=name))
        for s in steps:
            st = req.steps.add()
            if isinstance(s, AddColumn):
                st.add_column.column.CopyFrom(column_to_pb(s.to_column(0)))
            elif isinstance(s, DropColumn):
                st.drop_column.name = s.name
            elif isinstance(s, RenameColumn):
                st.rename_column.old_name = s.old
                st.rename_column.new_name = s.new
            else:
                raise InvalidArgument(f"alter step: unknown kind {type(s).__name__}")
        if new_name is not None:
            req.new_table_name = new_name
        if expected_schema_version is not None:
            req.expected_schema_version = expected_schema_version
        r = await self.master.ddl("AlterTable", req, deadline.remaining())
        self.meta.forget_table(name)
        if new_name is not None:
            self.meta.forget_table(new_name)
        if wait:
            await self._wait_done(
                "IsAlterTableDone", pb.IsAlterTableDoneRequestPB, r.table_id, deadline
            )
        return int(r.schema_version)

    async def delete_table(self, name: str, *, timeout: float | None = None) -> str:
        req = pb.DeleteTableRequestPB(table=pb.TableIdentifierPB(table_name=name))
        r = await self.master.ddl("DeleteTable", req, self._t(timeout))
        self.meta.forget_table(name)
        return str(r.table_id)

    async def grant(
        self,
        table: str,
        user: str,
        privileges: Sequence[str],
        *,
        revoke: bool = False,
        timeout: float | None = None,
    ) -> Grant:
        """Give `user` (or with `revoke`, take away) `privileges` on `table`, exactly once
        across retries and master failovers; what the user holds afterwards."""
        req = pb.GrantPrivilegesRequestPB(
            table=pb.TableIdentifierPB(table_name=table),
            user=user,
            privileges=_privileges_pb(privileges),
        )
        method = "RevokePrivileges" if revoke else "GrantPrivileges"
        r = await self.master.ddl(method, req, self._t(timeout))
        return Grant.from_pb(r.grant)

    async def list_grants(
        self, table: str = "", user: str = "", *, timeout: float | None = None
    ) -> list[Grant]:
        """Grants on live tables (admins only), optionally of one table or one user."""
        r = await self.master.call(
            "ListGrants", pb.ListGrantsRequestPB(table_name=table, user=user), self._t(timeout)
        )
        return [Grant.from_pb(g) for g in r.grants]

    async def list_tables(
        self, name_filter: str = "", *, timeout: float | None = None
    ) -> list[TableSummary]:
        r = await self.master.call(
            "ListTables", pb.ListTablesRequestPB(name_filter=name_filter), self._t(timeout)
        )
        return [
            TableSummary(
                t.table_id,
                t.name,
                pb.TableRecordPB.State.Name(t.state),
                t.schema_version,
                t.num_replicas,
                t.num_tablets,
            )
            for t in r.tables
        ]

    async def open_table(
        self, name: str, *, refresh: bool = False, timeout: float | None = None
    ) -> TableHandle:
        """The table's schema and partitioning (cached; `refresh` asks the master again)."""
        return await self.meta.table(name, self._t(timeout), refresh=refresh)

    async def table_locations(
        self, name: str, *, timeout: float | None = None
    ) -> list[TabletLocation]:
        info = await self.open_table(name, timeout=timeout)
        return await self.meta.tablets(info.table_id, self._t(timeout))

    async def list_tablet_servers(self, *, timeout: float | None = None) -> list[TabletServerInfo]:
        r = await self.master.call(
            "ListTabletServers", pb.ListTabletServersRequestPB(), self._t(timeout)
        )
        return [
            TabletServerInfo(
                uuid=s.instance.permanent_uuid,
                address=_hp(s.registration.rpc_addresses[0])
                if s.registration.rpc_addresses
                else "",
                live=s.live,
                millis_since_heartbeat=s.millis_since_heartbeat,
                num_replicas=s.num_replicas,
                num_leaders=s.num_leaders,
                location=s.registration.location,
            )
            for s in r.servers
        ]

    async def list_masters(self, *, timeout: float | None = None) -> list[MasterInfo]:
        r = await self.master.call("ListMasters", pb.ListMastersRequestPB(), self._t(timeout))
        return [
            MasterInfo(
                uuid=m.instance.permanent_uuid,
                address=_hp(m.rpc_addresses[0]) if m.rpc_addresses else "",
                role=pb.RaftRolePB.Name(m.role),
                term=m.term,
                committed_index=m.committed_index,
                error=m.error.message if m.HasField("error") else "",
                member_type=pb.MemberTypePB.Name(m.member_type),
            )
            for m in r.masters
        ]

    async def add_master(self, address: str, *, timeout: float | None = None) -> None:
        """Add the master at `address` (running with `join_existing = true`) to the group;
        returns once it is a voter. Safe to retry: adding a voter again does nothing."""
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise InvalidArgument(f"master address {address!r}: expected host:port")
        req = pb.AddMasterRequestPB(rpc_address=pb.HostPortPB(host=host, port=int(port)))
        await self.master.ddl("AddMaster", req, self._t(timeout))

    async def remove_master(self, master: str, *, timeout: float | None = None) -> None:
        """Remove the master named by uuid or host:port from the group."""
        req = pb.RemoveMasterRequestPB()
        host, sep, port = master.rpartition(":")
        if sep and port.isdigit():
            req.rpc_address.CopyFrom(pb.HostPortPB(host=host, port=int(port)))
        else:
            req.uuid = master
        await self.master.ddl("RemoveMaster", req, self._t(timeout))

    async def dump_catalog(
        self, *, include_removed: bool = False, timeout: float | None = None
    ) -> CatalogDump:
        """Every table and tablet record as of one committed index of the leader."""
        chunks = await self.master.stream(
            "DumpCatalog",
            pb.DumpCatalogRequestPB(include_removed=include_removed),
            self._t(timeout),
        )
        tables = [r.table for c in chunks for r in c.rows if r.HasField("table")]
        tablets = [r.tablet for c in chunks for r in c.rows if r.HasField("tablet")]
        return CatalogDump(chunks[0].committed_index if chunks else 0, tables, tablets)

    # --- writes ------------------------------------------------------------------------------

    def note_applied(self, tablet_id: str, index: int) -> None:
        if index > self._applied.get(tablet_id, 0):
            self._applied[tablet_id] = index

    def observe_timestamp(self, ts: int) -> None:
        """Remember a hybrid timestamp a server returned (`latest_timestamp`)."""
        if ts > self.latest_timestamp:
            self.latest_timestamp = ts

    def snapshot_now(self) -> int:
        """A snapshot time for a read that starts now: this machine's clock as hybrid time,
        and never before what this client has seen (its own writes are in it). The servers
        refuse it if this clock is ahead of theirs by more than their clock error bound."""
        return max(from_micros(time.time_ns() // 1000), self.latest_timestamp + 1)

    async def new_session(
        self, table: str, *, timeout: float | None = None, **kw: Any
    ) -> WriteSession:
        info = await self.open_table(table, timeout=timeout)
        return WriteSession(self, info, timeout=self._t(timeout) * 2, **kw)

    # --- transactions (service/client/transactions.py) ---------------------------------------

    async def begin_transaction(
        self,
        *,
        stream_query: str = "",
        stream_batch: int = 0,
        keepalive_ms: int = 0,
        timeout: float | None = None,
    ) -> Transaction:
        """A new transaction, kept alive until it commits or aborts. With (`stream_query`,
        `stream_batch`): a streaming micro-batch; ALREADY_EXISTS if that batch committed.
        `keepalive_ms`: how long it may go without a keep-alive (0: the master's default)."""
        req = pb.BeginTransactionRequestPB(
            stream_query=stream_query,
            stream_batch=stream_batch,
            propagated_timestamp=self.latest_timestamp,
            keepalive_ms=keepalive_ms,
        )
        resp = await self.master.ddl("BeginTransaction", req, self._t(timeout))
        txn = Transaction(
            self, int(resp.txn_id), resp.keepalive_ms / 1000.0, int(resp.start_timestamp)
        )
        self._transactions.add(txn)
        return txn

    def transaction(
        self, *, keepalive_ms: int = 0, timeout: float | None = None
    ) -> TransactionScope:
        """`async with client.transaction() as txn:` a transaction committed when the block
        ends normally, aborted when it raises (service/client/transactions.py)."""
        return TransactionScope(self, keepalive_ms=keepalive_ms, timeout=timeout)

    async def transaction_state(
        self,
        txn_id: int = 0,
        *,
        stream_query: str = "",
        stream_batch: int = 0,
        timeout: float | None = None,
    ) -> TransactionState:
        """A transaction's state, by id or by the stream batch it committed."""
        req = pb.GetTransactionStateRequestPB(
            txn_id=txn_id, stream_query=stream_query, stream_batch=stream_batch
        )
        resp = await self.master.call("GetTransactionState", req, self._t(timeout))
        return TransactionState.from_pb(resp)

    async def attach_transaction(self, txn_id: int, keepalive_s: float = 0.0) -> Transaction:
        """A transaction begun elsewhere (a Spark write's driver), to write in, keep alive
        (with `keepalive_s` > 0, every third of it) and commit or abort from here; only its
        owner's identity can."""
        txn = Transaction(self, txn_id, keepalive_s, keepalive=keepalive_s > 0)
        self._transactions.add(txn)
        return txn

    async def write(
        self,
        table: str,
        data: pa.Table | pa.RecordBatch,
        op: str = "upsert",
        *,
        timeout: float | None = None,
    ) -> WriteResult:
        """Write `data` to `table` with `op` and flush; the result carries per-row errors."""
        session = await self.new_session(table, timeout=timeout)
        await session.apply(data, op)
        return await session.flush()

    # --- scans -------------------------------------------------------------------------------

    async def scan_tokens(
        self,
        table: str,
        *,
        projection: Sequence[str] | None = None,
        predicates: Sequence[ColumnPredicate] = (),
        limit: int = 0,
        replica_selection: str = "leader",
        fault_tolerant: bool = True,
        batch_size_bytes: int = 0,
        rpc_timeout_s: float = 30.0,
        scan_timeout_s: float = 120.0,
        timeout: float | None = None,
        snapshot: int | bool | None = None,
        diff_start: int = 0,
    ) -> list[ScanToken]:
        """One token per tablet that may hold matching rows (pruned by key predicates).

        `snapshot`: None reads each replica's newest rows (READ_LATEST); True reads every
        tablet at one hybrid timestamp taken now (`snapshot_now`); an int reads at that hybrid
        timestamp (`service.common.hybrid_time`; `from_millis` turns a time in ms into one).
        All tokens of one call read the same snapshot, and a scan resumed on another replica
        reads it too (docs/design/tablets.md#R4). `diff_start` (with `snapshot`): a diff scan,
        the rows changed after it, each with the `__is_deleted` flag."""
        info = await self.open_table(table, timeout=timeout)
        if snapshot is None and diff_start:
            raise InvalidArgument("diff_start: a diff scan reads at a snapshot; give snapshot")
        at = 0
        if snapshot is not None and snapshot is not False:
            at = self.snapshot_now() if snapshot is True else int(snapshot)
            if at <= 0:
                raise InvalidArgument(f"snapshot: not a hybrid timestamp: {snapshot!r}")
            if diff_start and diff_start >= at:
                raise InvalidArgument(
                    f"diff_start {diff_start} is not before the snapshot time {at}"
                )
        spec = ScanSpec(
            projection=tuple(projection) if projection is not None else None,
            predicates=tuple(predicates),
            limit=limit,
        )
        canonical = validate_spec(info.schema, spec)
        locs = await self.meta.tablets(info.table_id, self._t(timeout))
        keep = set(
            prune(info.schema, info.partition_schema, canonical, [t.partition for t in locs])
        )
        wire = tuple(predicate_to_pb(info.schema, p).SerializeToString() for p in canonical)
        return [
            ScanToken(
                masters=self.masters,
                table_id=info.table_id,
                table_name=info.name,
                schema_version=info.schema.version,
                tablet_id=t.tablet_id,
                replicas=tuple(TokenReplica(r.ts_uuid, r.address, r.is_leader) for r in t.replicas),
                projection=spec.projection,
                predicates=wire,
                limit=limit,
                replica_selection=replica_selection,
                fault_tolerant=fault_tolerant,
                batch_size_bytes=batch_size_bytes,
                rpc_timeout_s=rpc_timeout_s,
                scan_timeout_s=scan_timeout_s,
                min_applied_index=self._applied.get(t.tablet_id, 0),
                partition_key_start=t.start,
                partition_key_end=t.end,
                authz_token=self.meta.authz_token(info.table_id),
                snapshot_timestamp=at,
                diff_start_timestamp=diff_start,
                propagated_timestamp=self.latest_timestamp,
            )
            for t in locs
            if t.partition in keep
        ]

    async def split_key_range(
        self, token: ScanToken, *, target_rows: int = 0, target_bytes: int = 0
    ) -> KeyRangeSplit:
        """Split keys for `token`'s [lower_key, upper_key) in chunks of about `target_rows`
        live rows and/or `target_bytes` bytes of its projection, from one replica
        (SplitKeyRange): tried in the token's replica order, failing over to the next when one
        is unavailable, not running or no longer hosts the tablet."""
        req = tpb.SplitKeyRangeRequestPB(
            tablet_id=token.tablet_id,
            start_primary_key=token.lower_key,
            stop_primary_key=token.upper_key,
            target_chunk_rows=target_rows,
            target_chunk_bytes=target_bytes,
            columns=list(token.projection or ()),
            authz_token=token.authz_token,
        )
        last: TesseraError | None = None
        for rep in order_replicas(token.replicas, token.replica_selection):
            req.dest_uuid = rep.ts_uuid
            try:
                resp: tpb.SplitKeyRangeResponsePB = await self.channels.tserver(
                    rep.address
                ).SplitKeyRange(req, timeout=token.rpc_timeout_s)  # type: ignore[misc]
            except _SPLIT_FAIL_OVER as err:
                last = err
                continue
            return _checked_split(token, rep.ts_uuid, resp)
        raise last or ServiceUnavailable(f"tablet {token.tablet_id}: the token lists no replica")

    async def split_token(
        self, token: ScanToken, rows_per_split: int, *, bytes_per_split: int = 0
    ) -> list[ScanToken]:
        """`token` cut into key ranges of about `rows_per_split` live rows each (and/or
        `bytes_per_split` bytes of its projection: whichever makes more ranges), kudu-spark's
        splitSizeBytes. A replica picks the split keys from the keys it holds sorted
        (`split_key_range`): no row is scanned. Ranges are balanced (a tablet of 750 rows cut
        by 200 gives 4 ranges of about 188) and tile the token's [lower_key, upper_key), so the
        pieces read exactly what the token reads; their sizes are estimates."""
        if rows_per_split < 0 or (rows_per_split == 0 and bytes_per_split <= 0):
            raise InvalidArgument(f"rows_per_split: must be > 0, got {rows_per_split}")
        if bytes_per_split < 0:
            raise InvalidArgument(f"bytes_per_split: must be >= 0, got {bytes_per_split}")
        split = await self.split_key_range(
            token, target_rows=rows_per_split, target_bytes=bytes_per_split
        )
        bounds = [token.lower_key, *split.split_keys, token.upper_key]
        return [replace(token, lower_key=lo, upper_key=hi) for lo, hi in itertools.pairwise(bounds)]

    def scanner(self, token: ScanToken) -> TabletScanner:
        return TabletScanner(self, token)

    async def scan_batches(self, token: ScanToken) -> AsyncIterator[pa.RecordBatch]:
        async for b in self.scanner(token).batches():
            yield b

    async def scan(
        self,
        table: str,
        *,
        projection: Sequence[str] | None = None,
        predicates: Sequence[ColumnPredicate] = (),
        limit: int = 0,
        parallel: int = 4,
        **kw: object,
    ) -> pa.Table:
        """Every matching row as one Arrow table (tablets scanned `parallel` at a time, their
        rows in tablet order; rows inside a tablet in primary-key order)."""
        info = await self.open_table(table)
        tokens = await self.scan_tokens(
            table,
            projection=projection,
            predicates=predicates,
            limit=limit,
            **kw,  # type: ignore[arg-type]
        )
        sem = asyncio.Semaphore(max(1, parallel))

        async def one(tok: ScanToken) -> list[pa.RecordBatch]:
            async with sem:
                return [b async for b in self.scan_batches(tok)]

        parts = await asyncio.gather(*(one(t) for t in tokens))
        names = list(projection) if projection is not None else list(info.schema.column_names)
        fields = [info.schema.to_arrow().field(n) for n in names]
        if kw.get("diff_start"):
            fields.append(pa.field(IS_DELETED, pa.bool_(), False))
        arrow_schema = pa.schema(fields)
        batches = [b for p in parts for b in p]
        out = (
            pa.Table.from_batches(batches, schema=arrow_schema)
            if batches
            else arrow_schema.empty_table()
        )
        return out.slice(0, limit) if limit else out
