"""The whole service as real processes: 3 masters and 3 real tablet servers on loopback.

CreateTable through the master leader; the master's background tasks send CreateTablet to the
real tablet servers, the replicas elect leaders and report them, every tablet turns RUNNING;
GetTableLocations names each tablet's leader; rows written to a tablet's leader are scanned
back exactly; DeleteTable removes the replicas from the servers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import SCHEMA, ClusterStubs, rows, scan_all, write_request

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
T = TypeVar("T")


def _wait(what: str, fn: Callable[[], T | None], timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _leader(stubs: dict[str, master_pb2_grpc.MasterServiceStub]) -> str | None:
    for address, stub in stubs.items():
        try:
            if stub.ConnectToMaster(pb.ConnectToMasterRequestPB(), timeout=1).role != pb.LEADER:
                continue
            stub.ListTables(pb.ListTablesRequestPB(), timeout=1)
            return address
        except grpc.RpcError:
            continue
    return None


def test_create_table_runs_on_real_tablet_servers_write_scan_delete(tmp_path: Path) -> None:
    with MiniCluster(tmp_path) as cluster:
        channels = [grpc.insecure_channel(a) for a in cluster.master_addresses]
        stubs = {
            a: master_pb2_grpc.MasterServiceStub(c)
            for a, c in zip(cluster.master_addresses, channels, strict=True)
        }
        try:
            leader = _wait("a serving master leader", lambda: _leader(stubs))
            m = stubs[leader]
            partitioning = PartitionSchema(
                hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(())
            )
            created = m.CreateTable(
                pb.CreateTableRequestPB(
                    request_id=pb.RequestIdPB(client_id="e2e", seq_no=1),
                    name="events",
                    schema=schema_to_pb(SCHEMA),
                    partition_schema=partition_schema_to_pb(partitioning, SCHEMA),
                    num_replicas=3,
                ),
                timeout=10,
            )
            table = pb.TableIdentifierPB(table_id=created.table_id)
            _wait(
                "every tablet RUNNING",
                lambda: (
                    m.IsCreateTableDone(pb.IsCreateTableDoneRequestPB(table=table), timeout=5).done
                ),
            )
            locs = m.GetTableLocations(pb.GetTableLocationsRequestPB(table=table), timeout=5)
            assert len(locs.tablet_locations) == 3
            for t in locs.tablet_locations:
                assert len(t.replicas) == 3
                assert sum(r.role == pb.LEADER for r in t.replicas) == 1, t

            # Write to one tablet through the leader the master names, scan it back.
            first = locs.tablet_locations[0]
            lead = next(r for r in first.replicas if r.role == pb.LEADER)

            async def write_and_scan() -> None:
                client = ClusterStubs(cluster, first.tablet_id)
                try:
                    data = client.data(lead.ts_uuid)
                    await data.Write(
                        write_request(lead.ts_uuid, first.tablet_id, rows(0, 1000)), timeout=10
                    )
                    got = await scan_all(data, lead.ts_uuid, first.tablet_id)
                    assert got.to_pydict() == rows(0, 1000).to_pydict()
                finally:
                    await client.close()

            asyncio.run(write_and_scan())

            m.DeleteTable(
                pb.DeleteTableRequestPB(
                    request_id=pb.RequestIdPB(client_id="e2e", seq_no=2), table=table
                ),
                timeout=10,
            )

            async def hosted() -> int:
                client = ClusterStubs(cluster, "")
                try:
                    n = 0
                    for ts in cluster.tservers.values():
                        r = await client.admin(ts.uuid).ListTablets(
                            tpb.ListTabletsRequestPB(dest_uuid=ts.uuid), timeout=5
                        )
                        n += len(r.replicas)
                    return n
                finally:
                    await client.close()

            _wait("replicas deleted from the servers", lambda: asyncio.run(hosted()) == 0 or None)
        finally:
            for c in channels:
                c.close()
