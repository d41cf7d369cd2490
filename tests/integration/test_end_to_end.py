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
import pyarrow as pa
import pytest

from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema_codec import partition_from_pb, partition_schema_to_pb, schema_to_pb
from service.pb import master_pb2 as pb
from service.pb import master_pb2_grpc
from service.pb import tserver_pb2 as tpb
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import SCHEMA, ClusterStubs, rows, scan_all, write_request
from service.tools import ksck_cmd

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
        channels = [cluster.sync_channel(a) for a in cluster.master_addresses]
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

            # The rows of 0..999 whose key hashes to this tablet: a tablet takes only its own
            # (docs/design/tablets.md#R2).
            part = partition_from_pb(first.partition)
            mine = rows(0, 1000).filter(
                pa.array(~partitioning.rows_outside(SCHEMA, part, rows(0, 1000)))
            )
            assert 0 < mine.num_rows < 1000

            async def write_and_scan() -> None:
                client = ClusterStubs(cluster, first.tablet_id)
                try:
                    data = client.data(lead.ts_uuid)
                    resp = await data.Write(
                        write_request(lead.ts_uuid, first.tablet_id, rows(0, 1000)), timeout=10
                    )
                    assert len(resp.per_row_errors) == 1000 - mine.num_rows
                    assert {e.error.code for e in resp.per_row_errors} == {"OUTSIDE_PARTITION"}
                    got = await scan_all(data, lead.ts_uuid, first.tablet_id)
                    assert got.to_pydict() == mine.to_pydict()
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


def test_dead_server_is_replaced_by_a_copy_on_a_fourth_server(tmp_path: Path) -> None:
    """3-4-3 on real processes: a tablet server stopped past the eviction time loses its
    replica; the master adds one on the fourth server, the tablet copy runs, the dead replica is
    removed, and every replica of the new config has the same checksum."""
    overrides = {
        **FAST_RAFT,
        "unresponsive_timeout_ms": "1500",
        "replica_eviction_timeout_ms": "2000",
        "bg_task_interval_ms": "200",
    }
    with MiniCluster(tmp_path, num_tservers=3, master_overrides=overrides) as cluster:
        channels = [cluster.sync_channel(a) for a in cluster.master_addresses]
        stubs = {
            a: master_pb2_grpc.MasterServiceStub(c)
            for a, c in zip(cluster.master_addresses, channels, strict=True)
        }
        try:
            leader = _wait("a serving master leader", lambda: _leader(stubs))
            m = stubs[leader]
            created = m.CreateTable(
                pb.CreateTableRequestPB(
                    request_id=pb.RequestIdPB(client_id="e2e", seq_no=1),
                    name="one",
                    schema=schema_to_pb(SCHEMA),
                    partition_schema=partition_schema_to_pb(PartitionSchema(), SCHEMA),
                    num_replicas=3,
                ),
                timeout=10,
            )
            table = pb.TableIdentifierPB(table_id=created.table_id)
            _wait(
                "the tablet RUNNING",
                lambda: (
                    m.IsCreateTableDone(pb.IsCreateTableDoneRequestPB(table=table), timeout=5).done
                ),
            )
            locs = m.GetTableLocations(pb.GetTableLocationsRequestPB(table=table), timeout=5)
            (tablet,) = locs.tablet_locations
            lead = next(r.ts_uuid for r in tablet.replicas if r.role == pb.LEADER)

            async def write() -> None:
                client = ClusterStubs(cluster, tablet.tablet_id)
                try:
                    await client.data(lead).Write(
                        write_request(lead, tablet.tablet_id, rows(0, 5000)), timeout=10
                    )
                finally:
                    await client.close()

            asyncio.run(write())
            ts4 = cluster.add_tserver_slot("ts-4")
            cluster.start_tserver("ts-4")
            victim = next(r.ts_uuid for r in tablet.replicas if r.ts_uuid != lead)
            cluster.kill_tserver(cluster.tserver_by_uuid(victim).name)

            def replaced() -> list[str] | None:
                r = m.GetTableLocations(pb.GetTableLocationsRequestPB(table=table), timeout=5)
                uuids = sorted(x.ts_uuid for x in r.tablet_locations[0].replicas)
                voters = [
                    x.ts_uuid
                    for x in r.tablet_locations[0].replicas
                    if x.member_type != pb.NON_VOTER
                ]
                if victim not in uuids and ts4.uuid in voters and len(uuids) == 3:
                    return uuids
                return None

            ksck = ["ksck", "--masters", ",".join(cluster.master_addresses), "--timeout", "3"]
            ksck += ["--credentials", cluster.credentials_dir() or ""]
            assert ksck_cmd.main(ksck) == 1  # a voter's server is down: UNDER_REPLICATED
            members = _wait("the dead replica replaced by ts-4", replaced, timeout=90)
            # Healed by 3-4-3: the dead server is GONE (no config names it), ksck is clean.
            _wait("ksck clean after re-replication", lambda: ksck_cmd.main(ksck) == 0 or None)

            async def checksums() -> set[tuple[int, bytes]]:
                client = ClusterStubs(cluster, tablet.tablet_id)
                try:
                    leader_now = await client.leader(members)
                    probe = await client.data(leader_now).Write(
                        write_request(leader_now, tablet.tablet_id, rows(9000, 9001)), timeout=10
                    )
                    out = set()
                    for u in members:
                        c = await client.data(u).Checksum(
                            tpb.ChecksumRequestPB(
                                dest_uuid=u,
                                tablet_id=tablet.tablet_id,
                                min_applied_index=probe.applied_index,
                            ),
                            timeout=30,
                        )
                        out.add((c.row_count, c.digest))
                    return out
                finally:
                    await client.close()

            sums = asyncio.run(checksums())
            assert len(sums) == 1 and next(iter(sums))[0] == 5001, sums
        finally:
            for c in channels:
                c.close()
