"""Catalog reads are linearizable: a deposed leader never answers from its stale memory.

The scenario, on real processes: SIGSTOP the master leader past an election; through the new
leader create `new_t` and delete `gone_t`; while the old leader is stopped, 40 clients queue
reads on it (ListTables, GetTableSchema of both tables, ConnectToMaster); SIGCONT it. Before,
the old leader answered them from memory for the 8-30 ms it took to learn of the new term:
LEADER of the old term, ListTables without `new_t` and with `gone_t`, GetTableSchema(gone_t)
OK. Now every catalog read passes a ReadIndex round first, which a deposed leader cannot
complete: each queued read either fails (NOT_THE_LEADER, UNAVAILABLE) or sees the new state.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.testing.master_cluster import MasterCluster
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCHEMA = Schema.build([("id", ColumnType.INT64)], key="id")
CLIENTS = 40


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MasterCluster]:
    with MiniCluster(tmp_path, num_tservers=1) as c:
        yield c.masters


def _ddl(cluster: MasterCluster, fn: str, *args: Any, **kwargs: Any) -> None:
    from service.client.sync import SyncClient

    with SyncClient(cluster.addresses, timeout=60, credentials=cluster.credentials()) as c:
        c.call(fn, *args, **kwargs)


async def _queued_reads(
    cluster: MasterCluster, old: str, stopped: asyncio.Event, resume: asyncio.Event
) -> list[tuple[str, object]]:
    channels = [cluster.channel(old) for _ in range(CLIENTS)]
    stubs = [master_pb2_grpc.MasterServiceStub(ch) for ch in channels]
    for s in stubs:  # connected before the pause, as long-lived clients are
        await s.Ping(pb.PingRequestPB(), timeout=10)
    stopped.set()
    await resume.wait()

    async def one(kind: str, stub: Any) -> tuple[str, object]:
        try:
            if kind == "list":
                r = await stub.ListTables(pb.ListTablesRequestPB(), timeout=20)
                return kind, {t.name for t in r.tables}
            if kind == "connect":
                r = await stub.ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=20)
                return kind, (r.role, r.term)
            name = "gone_t" if kind == "schema_gone" else "new_t"
            req = pb.GetTableSchemaRequestPB(table=pb.TableIdentifierPB(table_name=name))
            await stub.GetTableSchema(req, timeout=20)
            return kind, "OK"
        except grpc.aio.AioRpcError as e:
            return kind, e.code()

    try:
        kinds = ("list", "schema_gone", "schema_new", "connect")
        return await asyncio.gather(*(one(k, s) for s in stubs for k in kinds))
    finally:
        for ch in channels:
            await ch.close()


def test_a_paused_old_leader_never_serves_stale_catalog_reads(cluster: MasterCluster) -> None:
    ps = PartitionSchema(range=RangeSchema(("id",)))
    _ddl(cluster, "create_table", "gone_t", SCHEMA, ps, num_replicas=1)
    old, old_term = cluster.leader()
    old_proc = cluster.by_address(old).proc
    assert old_proc is not None
    others = [a for a in cluster.addresses if a != old]

    async def main() -> list[tuple[str, object]]:
        stopped, resume = asyncio.Event(), asyncio.Event()
        reads = asyncio.create_task(_queued_reads(cluster, old, stopped, resume))
        await stopped.wait()
        old_proc.send_signal(signal.SIGSTOP)
        try:
            _new, new_term = await asyncio.to_thread(cluster.leader, others)
            assert new_term > old_term
            await asyncio.to_thread(
                _ddl, cluster, "create_table", "new_t", SCHEMA, ps, num_replicas=1
            )
            await asyncio.to_thread(_ddl, cluster, "delete_table", "gone_t")
            resume.set()  # the reads go out to the stopped leader and queue there
            await asyncio.sleep(0.5)
        finally:
            old_proc.send_signal(signal.SIGCONT)
        return await reads

    results = asyncio.run(main())
    refused = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)  # not the leader
    stale = []
    for kind, got in results:
        if got in refused:
            continue
        if kind == "list" and isinstance(got, set) and "new_t" in got and "gone_t" not in got:
            continue
        if kind == "schema_gone" and got is grpc.StatusCode.NOT_FOUND:
            continue
        if kind == "schema_new" and got == "OK":
            continue
        if kind == "connect" and isinstance(got, tuple) and got != (pb.LEADER, old_term):
            continue
        stale.append((kind, got))
    assert stale == [], f"{len(stale)} of {len(results)} reads answered from the old state: {stale}"
    assert len(results) == 4 * CLIENTS
