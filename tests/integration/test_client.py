"""The client library against real processes: 3 masters and 3 tablet servers on loopback.

The client's proofs: DDL survives the master leader being killed in the middle (answered once);
a stale location cache recovers when a tablet leader dies; a scan survives the loss of the
replica it is reading with exact results; per-row errors name the row and key; predicates are
pushed down and tablets pruned.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.client import ColumnPredicate as P
from service.client import TesseraClient
from service.client.sync import SyncClient
from service.common.errors import AlreadyExists, InvalidArgument, NotFound
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.pb import master_pb2 as pb
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build(
    [
        ("id", ColumnType.INT64),
        ("name", ColumnType.STRING),
        ("score", ColumnType.DOUBLE),
        ("flag", ColumnType.BOOL),
    ],
    key="id",
)
# 3 hash buckets x 2 ranges = 6 tablets.
PARTITIONING = PartitionSchema(
    hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(("id",)), split_rows=((50_000,),)
)


def data(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([None if i % 7 == 0 else f"n{i}" for i in ids], pa.string()),
            "score": pa.array([i / 4 for i in ids], pa.float64()),
            "flag": pa.array([i % 2 == 0 for i in ids], pa.bool_()),
        }
    )


def sort(t: pa.Table) -> pa.Table:
    """By key, with the nullability of `data()` (scans declare key columns NOT NULL)."""
    t = t.sort_by("id")
    return t.cast(pa.schema([f.with_nullable(True) for f in t.schema]))


def _leader_master(cluster: MiniCluster, client: TesseraClient) -> str:
    assert client.master.leader is not None
    return cluster.masters.by_address(client.master.leader).name


def test_client_ddl_writes_scans_and_failures(tmp_path: Path) -> None:
    with MiniCluster(tmp_path) as cluster:

        async def main() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                table_id = await c.create_table("events", SCHEMA, PARTITIONING, num_replicas=3)
                with pytest.raises(AlreadyExists):
                    await c.create_table("events", SCHEMA, PARTITIONING)
                assert [t.name for t in await c.list_tables()] == ["events"]
                assert len(await c.table_locations("events")) == 6
                servers = await c.list_tablet_servers()
                assert len(servers) == 3 and all(s.live for s in servers)
                assert sum(m.role == "LEADER" for m in await c.list_masters()) == 1

                # Writes: 100k rows spread over 6 tablets, then read back exactly.
                rows = data(0, 100_000)
                r = await c.write("events", rows, "insert")
                assert (r.rows_applied, r.errors) == (100_000, [])
                got = await c.scan("events")
                assert sort(got).equals(rows)

                # Per-row errors keep their row index and key; other rows still apply.
                mixed = pa.concat_tables([data(99_998, 100_000), data(200_000, 200_003)])
                r = await c.write("events", mixed, "insert")
                assert r.rows_applied == 3
                assert [(e.row_index, e.key, e.code) for e in r.errors] == [
                    (0, (99_998,), "ALREADY_EXISTS"),
                    (1, (99_999,), "ALREADY_EXISTS"),
                ]
                r = await c.write("events", data(200_000, 200_003).select(["id"]), "delete")
                assert r.rows_applied == 3

                # Predicates pushed down; a key equality reads one tablet.
                preds = [P("id", "GE", (1_000,)), P("id", "LT", (1_500,)), P("name", "IS_NOT_NULL")]
                got = await c.scan("events", projection=["id", "score"], predicates=preds)
                mask = pc.and_(
                    pc.and_(pc.greater_equal(rows["id"], 1_000), pc.less(rows["id"], 1_500)),
                    pc.is_valid(rows["name"]),
                )
                assert sort(got).equals(rows.filter(mask).select(["id", "score"]))
                assert len(await c.scan_tokens("events", predicates=[P("id", "EQ", (77,))])) == 1
                assert (
                    len(await c.scan_tokens("events", predicates=[P("id", "GE", (60_000,))])) == 3
                )
                got = await c.scan("events", predicates=[P("id", "EQ", (77,))])
                assert got.to_pylist() == rows.slice(77, 1).to_pylist()
                assert (await c.scan("events", limit=10)).num_rows == 10

                # Bad input: a clear error naming the problem, nothing changed.
                with pytest.raises(InvalidArgument, match="no key column 'id'"):
                    await c.write("events", rows.select(["name"]), "upsert")
                with pytest.raises(InvalidArgument, match="nope"):
                    await c.scan("events", projection=["nope"])
                with pytest.raises(NotFound):
                    await c.open_table("missing")

                # Alter: a new column, written and read through the refreshed schema.
                version = await c.alter_table(
                    "events", [AddColumn("extra", ColumnType.INT32, default=5)]
                )
                info = await c.open_table("events")
                assert info.schema.version == version and info.schema.has_column("extra")
                got = await c.scan(
                    "events", projection=["id", "extra"], predicates=[P("id", "EQ", (3,))]
                )
                assert got.to_pylist() == [{"id": 3, "extra": 5}]

                # The master leader killed in the middle of a DDL: answered once.
                victim = _leader_master(cluster, c)
                create = asyncio.create_task(
                    c.create_table("second", SCHEMA, PartitionSchema(range=RangeSchema(("id",))))
                )
                await asyncio.sleep(0.02)
                cluster.masters.kill(victim)
                await create
                assert sorted(t.name for t in await c.list_tables()) == ["events", "second"]
                assert _leader_master(cluster, c) != victim
                # A retried request id is answered with the original result, not re-executed.
                req = pb.DeleteTableRequestPB(table=pb.TableIdentifierPB(table_name="second"))
                req.request_id.CopyFrom(c.master.request_ids.new())
                first = await c.master.call("DeleteTable", req, 30)
                again = await c.master.call("DeleteTable", req, 30)
                assert first.table_id == again.table_id
                cluster.masters.start_master(victim)
                assert table_id

        asyncio.run(main())


def test_client_survives_tablet_server_loss(tmp_path: Path) -> None:
    """A tablet leader dies: writes re-route (stale cache), a running scan resumes on another
    replica after its last key, and the result is exact."""
    with MiniCluster(tmp_path) as cluster:

        async def main() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                await c.create_table(
                    "t", SCHEMA, PartitionSchema(range=RangeSchema(("id",))), num_replicas=3
                )
                rows = data(0, 60_000)
                await c.write("t", rows, "upsert")
                (loc,) = await c.table_locations("t")
                leader = loc.leader()
                assert leader is not None

                # Scan in small pages; kill the leader after the first page.
                (tok,) = await c.scan_tokens("t", batch_size_bytes=64 << 10)
                scanner = c.scanner(tok)
                batches = []
                async for b in scanner.batches():
                    batches.append(b)
                    if len(batches) == 1:
                        cluster.kill_tserver(cluster.tserver_by_uuid(leader.ts_uuid).name)
                got = pa.Table.from_batches(batches)
                assert scanner.failovers >= 1
                assert got.num_rows == 60_000
                assert sort(got).equals(rows)  # key order, no duplicates, nothing missing

                # The cached leader is dead: the write finds the new one.
                t0 = time.monotonic()
                r = await c.write("t", data(60_000, 61_000), "insert")
                assert (r.rows_applied, r.errors) == (1_000, [])
                assert r.retries >= 1
                assert time.monotonic() - t0 < 30
                assert (await c.scan("t")).num_rows == 61_000

        asyncio.run(main())


def test_sync_client_facade(tmp_path: Path) -> None:
    with (
        MiniCluster(tmp_path, num_masters=1, num_tservers=1) as cluster,
        SyncClient(cluster.master_addresses, credentials=cluster.credentials()) as sc,
    ):
        sc.call(
            "create_table",
            "s",
            SCHEMA,
            PartitionSchema(range=RangeSchema(("id",))),
            num_replicas=1,
        )
        assert sc.write("s", data(0, 5_000)).rows_applied == 5_000
        (tok,) = sc.scan_tokens("s", predicates=[P("id", "LT", (10,))])
        got = pa.Table.from_batches(list(sc.scan_batches(tok)))
        assert sort(got).equals(data(0, 10))


def test_dump_catalog_is_one_committed_index(tmp_path: Path) -> None:
    with MiniCluster(tmp_path, num_masters=1, num_tservers=1) as cluster:

        async def main() -> None:
            async with TesseraClient(
                cluster.master_addresses, timeout=60, credentials=cluster.credentials()
            ) as c:
                ps = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))
                await c.create_table("a", SCHEMA, ps, num_replicas=1)
                await c.create_table("b", SCHEMA, ps, num_replicas=1)
                await c.delete_table("b")
                live = await c.dump_catalog()
                assert [t.name for t in live.tables] == ["a"]
                assert len(live.tablets) == 3
                assert {t.table_id for t in live.tablets} == {live.tables[0].table_id}
                assert all(t.state == pb.TabletRecordPB.RUNNING for t in live.tablets)
                everything = await c.dump_catalog(include_removed=True)
                assert sorted(t.name for t in everything.tables) == ["a", "b"]
                assert len(everything.tablets) == 6
                assert everything.committed_index >= live.committed_index > 0
                # Chunking: the same rows, however they are cut.
                chunks = await c.master.stream(
                    "DumpCatalog",
                    pb.DumpCatalogRequestPB(include_removed=True, max_rows_per_chunk=2),
                    10,
                )
                assert len(chunks) == 4
                assert len({ch.committed_index for ch in chunks}) == 1
                with pytest.raises(InvalidArgument, match="max_rows_per_chunk"):
                    await c.master.stream(
                        "DumpCatalog", pb.DumpCatalogRequestPB(max_rows_per_chunk=10**6), 10
                    )

        asyncio.run(main())
