"""The proof of the commit point (docs/design/coordinator.md#R1): the master leader killed -9 at
each step of CreateTable, AlterTable and DeleteTable (3 master processes, 3 tablet servers).

Every master of a case is started with `TESSERA_FAILPOINT_CRASH_AT=<point>:1` and one ONCE file
(service.common.failpoints), so the first master to reach the point dies there with exit code
137 and the others carry on past it. Only the leader runs DDL and background tasks, so the
victim is the leader of the moment. The DDL goes through the client, which keeps its request id
across the failover. Each case then checks:

* the DDL took effect exactly once: the call succeeded (a retry of a committed entry is answered
  from the remembered response; a crash before the entry was proposed is retried on the new
  leader), and the catalog holds exactly one table of that name with the id the call returned;
* nobody ever saw a half-created table: a second client polls every master throughout (one
  RPC each, no retries, so each observation is one atomic answer) and a table it sees listed
  has all its tablets, its locations are all of them or TabletNotRunning, its schema is one of
  the committed versions;
* what was pending finishes under the new leader: every replica RUNNING on the tablet servers
  after a create, every replica at the new schema version after an alter, every replica gone
  after a delete;
* the ONCE file exists and exactly one master exited with 137: the crash did happen.

The watcher's first answer comes before the DDL starts and the state after it is awaited in its
answers too, so every case observes across the failover. Each case starts its own cluster (the
failpoint is fixed when a master starts): 6-8 s each on an idle 2-core machine, about 70 s in all.
`create_tablet:after_rpc` found a tablet-server bug: the master died with CreateTablet RPCs to
other servers in flight, their handlers were cancelled half way, and the replica left behind
never started while the new leader's retry was answered "created". TabletManager.create_tablet
now finishes a creation whose caller went away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import grpc.aio
import pyarrow as pa
import pytest

from service.client import TesseraClient
from service.common import failpoints
from service.common.errors import (
    NotFound,
    NotTheLeader,
    ServiceUnavailable,
    TabletNotRunning,
    TesseraError,
    Timeout,
    from_grpc,
)
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc, tserver_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T = TypeVar("T")

NAME = "t"
SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
# 2 hash buckets x 2 ranges = 4 tablets, 3 replicas each.
PARTITIONING = PartitionSchema(
    hash=(HashBucketSchema(("id",), 2),), range=RangeSchema(("id",)), split_rows=((1_000,),)
)
PARTITION_KEYS = [
    (p.partition_key_start, p.partition_key_end) for p in PARTITIONING.create_partitions(SCHEMA)
]
TABLETS = len(PARTITION_KEYS)
REPLICAS = 3
NEW_COLUMN = AddColumn("extra", ColumnType.INT32, default=7)

CREATE_POINTS = [
    "create_table:before_replicate",
    "create_table:after_replicate",
    "assign_tablets:after_replicate",
    "create_tablet:after_rpc",
    "process_report:after_replicate",
]
ALTER_POINTS = [
    "alter_table:before_replicate",
    "alter_table:after_replicate",
    "alter_schema:after_rpc",
]
DELETE_POINTS = [
    "delete_table:before_replicate",
    "delete_table:after_replicate",
    "delete_tablet:after_rpc",
]

MASTER_OVERRIDES = {
    **FAST_RAFT,
    "bg_task_interval_ms": "100",
    "task_retry_initial_ms": "100",
    "task_retry_max_ms": "500",
}
DEADLINE_S = 45.0
"""For each thing awaited: far above what it takes (a few seconds), far below the test timeout."""


# --- the cluster -----------------------------------------------------------------------------


@contextmanager
def _armed_cluster(
    tmp_path: Path, point: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MiniCluster, Path]]:
    """3 masters armed to crash at `point` (the first to reach it), 3 tablet servers."""
    once = tmp_path / "crashed"
    # Read by the master processes when they start; the tablet servers never reach these points.
    monkeypatch.setenv(failpoints.CRASH_AT, f"{point}:1")
    monkeypatch.setenv(failpoints.ONCE_FILE, str(once))
    with MiniCluster(tmp_path / "cluster", master_overrides=MASTER_OVERRIDES) as cluster:
        yield cluster, once


async def _until(what: str, probe: Callable[[], Awaitable[T | None]]) -> T:
    """Poll `probe` until it returns something other than None, for at most DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        got = await probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S}s: {what}")
        await asyncio.sleep(0.05)


async def _crashed(cluster: MiniCluster, once: Path) -> str:
    """The master that died at the failpoint (exactly one, exit code 137)."""

    async def victim() -> str | None:
        codes = cluster.masters.exit_codes()
        dead = {n: c for n, c in codes.items() if c is not None}
        if not once.exists() or not dead:
            return None
        assert list(dead.values()) == [137], f"exit codes {codes}"
        return next(iter(dead))

    return await _until("a master crashed at the failpoint", victim)


async def _replicas(cluster: MiniCluster, tablet_ids: set[str]) -> list[tpb.ReplicaStatusPB]:
    """Every replica of `tablet_ids` the tablet servers host now."""
    out: list[tpb.ReplicaStatusPB] = []
    for ts in cluster.tservers.values():
        async with cluster.channel(ts.address) as ch:
            stub = tserver_pb2_grpc.TabletServerAdminServiceStub(ch)
            r = await stub.ListTablets(tpb.ListTabletsRequestPB(dest_uuid=ts.uuid), timeout=5)
        out.extend(x for x in r.replicas if x.tablet_id in tablet_ids)
    return out


# --- the second client: no half-created table, ever ------------------------------------------


@dataclass
class Watch:
    """What the watcher saw; every observation is one master's answer to one RPC."""

    versions: frozenset[int] = frozenset()
    """Schema versions a visible table may have (empty: not checked)."""
    absent: int = 0
    """Answers "no such table"."""
    pending: int = 0
    """Answers "the table exists, not every tablet RUNNING yet" (TabletNotRunning)."""
    complete: int = 0
    """Answers with the locations of every tablet."""
    seen_versions: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    async def until(self, what: str, ok: Callable[[Watch], bool]) -> None:
        """Wait until the watcher's answers so far satisfy `ok`."""

        async def probe() -> bool | None:
            if self.task is not None and self.task.done():
                self.task.result()  # raises what stopped it
                raise AssertionError("the watcher stopped")
            return True if ok(self) else None

        await _until(f"the watcher saw {what}", probe)

    async def run(self, cluster: MiniCluster) -> None:
        channels = [cluster.channel(a) for a in cluster.master_addresses]
        stubs = [master_pb2_grpc.MasterServiceStub(ch) for ch in channels]
        try:
            while not self.stop.is_set():
                for stub in stubs:
                    await self._observe(stub)
                await asyncio.sleep(0.02)  # polling pace, not a wait for anything to happen
        finally:
            for ch in channels:
                await ch.close(None)

    async def _observe(self, stub: master_pb2_grpc.MasterServiceStub) -> None:
        table = pb.TableIdentifierPB(table_name=NAME)
        try:
            listed = await stub.ListTables(pb.ListTablesRequestPB(), timeout=1)  # type: ignore[misc]
            mine = [t for t in listed.tables if t.name == NAME]
            self.check(len(mine) <= 1, f"two live tables named {NAME!r}: {mine}")
            for t in mine:
                self.check(t.num_tablets == TABLETS, f"listed with {t.num_tablets} tablets: {t}")
                self.check_version(t.schema_version, f"listed: {t}")
        except grpc.aio.AioRpcError as e:
            self._expected(from_grpc(e))
        try:
            locs = await stub.GetTableLocations(  # type: ignore[misc]
                pb.GetTableLocationsRequestPB(table=table, max_returned_locations=100), timeout=1
            )
        except grpc.aio.AioRpcError as e:
            err = from_grpc(e)
            if isinstance(err, NotFound):
                self.absent += 1
            elif isinstance(err, TabletNotRunning):
                self.pending += 1
            else:
                self._expected(err)
        else:
            tablets = list(locs.tablet_locations)
            got = [
                (t.partition.partition_key_start, t.partition.partition_key_end) for t in tablets
            ]
            self.check(got == PARTITION_KEYS, f"locations of other partitions: {got}")
            self.check(
                all(len(t.replicas) == REPLICAS for t in tablets),
                f"a tablet without its {REPLICAS} replicas: {locs}",
            )
            self.complete += 1
        try:
            schema = await stub.GetTableSchema(  # type: ignore[misc]
                pb.GetTableSchemaRequestPB(table=table), timeout=1
            )
        except grpc.aio.AioRpcError as e:
            err = from_grpc(e)
            if not isinstance(err, NotFound):
                self._expected(err)
        else:
            version = schema.schema.version
            self.seen_versions.add(version)
            self.check_version(version, f"schema {schema.schema}")
            has_new = any(c.name == NEW_COLUMN.name for c in schema.schema.columns)
            if self.versions:
                self.check(
                    has_new == (version == max(self.versions)),
                    f"schema version {version} with the new column: {has_new}",
                )
            try:
                done = await stub.IsCreateTableDone(  # type: ignore[misc]
                    pb.IsCreateTableDoneRequestPB(table=table), timeout=1
                )
            except grpc.aio.AioRpcError as e:
                err = from_grpc(e)
                if not isinstance(err, NotFound):
                    self._expected(err)
            else:
                self.check(done.tablets_total == TABLETS, f"IsCreateTableDone {done}")

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.errors.append(what)

    def check_version(self, version: int, what: str) -> None:
        if self.versions:
            self.check(version in self.versions, f"schema version {version}: {what}")

    def _expected(self, err: TesseraError) -> None:
        """Failover noise: a follower, a leader still loading, a dead master. Nothing else."""
        if not isinstance(err, NotTheLeader | ServiceUnavailable | Timeout):
            self.errors.append(f"unexpected error: {err!r}")


@asynccontextmanager
async def _watching(
    cluster: MiniCluster, versions: frozenset[int] = frozenset()
) -> AsyncIterator[Watch]:
    """Run a `Watch` for the duration of the block; fail if it saw anything wrong."""
    w = Watch(versions=versions)
    w.task = task = asyncio.create_task(w.run(cluster))
    try:
        # Its first answer from a leader comes before the DDL under test starts.
        await w.until("a leader's answer", lambda w: w.absent + w.pending + w.complete > 0)
        yield w
    finally:
        w.stop.set()
        await task
    assert w.errors == [], f"a client saw a half-done DDL: {w.errors[:5]}"


# --- the cases -------------------------------------------------------------------------------


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(0, 2 * n, 2), pa.int64()),
            "v": pa.array([f"r{i}" for i in range(n)], pa.string()),
        }
    )


async def _created_once(c: TesseraClient, table_id: str) -> list[pb.TabletRecordPB]:
    """The table exists once, with the id the call returned, and all its tablets RUNNING."""
    dump = await c.dump_catalog(include_removed=True)
    tables = [t for t in dump.tables if t.name == NAME]
    assert [t.table_id for t in tables] == [table_id]
    tablets = [t for t in dump.tablets if t.table_id == table_id]
    assert len(tablets) == TABLETS
    assert all(t.state == pb.TabletRecordPB.RUNNING for t in tablets), tablets
    assert len(dump.tablets) == TABLETS, "no replaced or stray tablets"
    return tablets


async def _all_replicas_running(cluster: MiniCluster, tablet_ids: set[str]) -> None:
    async def running() -> bool | None:
        replicas = await _replicas(cluster, tablet_ids)
        ok = len(replicas) == TABLETS * REPLICAS and all(
            r.state == pb.REPLICA_RUNNING for r in replicas
        )
        return True if ok else None

    await _until("every replica RUNNING on the tablet servers", running)


@pytest.mark.parametrize("point", CREATE_POINTS)
def test_create_table_survives_leader_crash(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _armed_cluster(tmp_path, point, monkeypatch) as (cluster, once):

        async def main() -> None:
            async with (
                TesseraClient(
                    cluster.master_addresses, timeout=DEADLINE_S, credentials=cluster.credentials()
                ) as c,
                _watching(cluster) as seen,
            ):
                assert seen.absent > 0 and seen.pending == seen.complete == 0
                # Returns once IsCreateTableDone says every tablet is RUNNING: past every point.
                table_id = await c.create_table(NAME, SCHEMA, PARTITIONING, num_replicas=REPLICAS)
                await _crashed(cluster, once)
                tablets = await _created_once(c, table_id)
                await _all_replicas_running(cluster, {t.tablet_id for t in tablets})
                await seen.until("every tablet located", lambda w: w.complete > 0)
                assert (await c.write(NAME, _rows(100))).rows_applied == 100
                assert (await c.scan(NAME)).num_rows == 100

        asyncio.run(main())


@pytest.mark.parametrize("point", ALTER_POINTS)
def test_alter_table_survives_leader_crash(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _armed_cluster(tmp_path, point, monkeypatch) as (cluster, once):

        async def main() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=DEADLINE_S, credentials=cluster.credentials()
            ) as c:
                table_id = await c.create_table(NAME, SCHEMA, PARTITIONING, num_replicas=REPLICAS)
                assert (await c.write(NAME, _rows(100))).rows_applied == 100
                assert not once.exists()
                v0 = (await c.open_table(NAME)).schema.version
                async with _watching(cluster, frozenset({v0, v0 + 1})) as seen:
                    await seen.until(f"schema version {v0}", lambda w: v0 in w.seen_versions)
                    # Returns once IsAlterTableDone: every tablet's leader at the new version.
                    version = await c.alter_table(NAME, [NEW_COLUMN])
                    await _crashed(cluster, once)
                    await seen.until("the new schema version", lambda w: version in w.seen_versions)
                assert version == v0 + 1, "the alter was applied exactly once"
                (listed,) = await c.list_tables()
                assert (listed.table_id, listed.state, listed.schema_version) == (
                    table_id,
                    "RUNNING",
                    version,
                )
                info = await c.open_table(NAME, refresh=True)
                assert info.schema.version == version and info.schema.has_column("extra")
                tablet_ids = {t.tablet_id for t in await _created_once(c, table_id)}

                async def altered() -> bool | None:
                    replicas = await _replicas(cluster, tablet_ids)
                    ok = len(replicas) == TABLETS * REPLICAS and all(
                        r.schema_version == version for r in replicas
                    )
                    return True if ok else None

                await _until("every replica at the new schema version", altered)
                got = await c.scan(NAME, projection=["id", "extra"])
                assert got.num_rows == 100 and set(got["extra"].to_pylist()) == {7}

        asyncio.run(main())


@pytest.mark.parametrize("point", DELETE_POINTS)
def test_delete_table_survives_leader_crash(
    point: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _armed_cluster(tmp_path, point, monkeypatch) as (cluster, once):

        async def main() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=DEADLINE_S, credentials=cluster.credentials()
            ) as c:
                table_id = await c.create_table(NAME, SCHEMA, PARTITIONING, num_replicas=REPLICAS)
                tablet_ids = {t.tablet_id for t in await _created_once(c, table_id)}
                await _all_replicas_running(cluster, tablet_ids)
                assert not once.exists()
                async with _watching(cluster) as seen:
                    assert seen.complete > 0 and seen.absent == 0
                    assert await c.delete_table(NAME) == table_id
                    await _crashed(cluster, once)  # delete_tablet:after_rpc: after the answer
                    assert await c.list_tables() == []
                    with pytest.raises(NotFound):
                        await c.open_table(NAME, refresh=True)
                    await seen.until("the table gone", lambda w: w.absent > 0)
                dump = await c.dump_catalog(include_removed=True)
                assert [(t.table_id, t.state) for t in dump.tables] == [
                    (table_id, pb.TableRecordPB.REMOVED)
                ]
                assert {t.tablet_id for t in dump.tablets} == tablet_ids
                assert all(t.state == pb.TabletRecordPB.DELETED for t in dump.tablets)

                async def gone() -> bool | None:
                    return True if not await _replicas(cluster, tablet_ids) else None

                await _until("every replica of the deleted table deleted", gone)

        asyncio.run(main())
