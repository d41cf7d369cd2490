"""Tablet fixtures for tests and benchmarks: a schema, rows, requests, and scans to the end over
gRPC stubs (shipped with service.testing so bench/ can use them too)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pyarrow as pa

from service.client.scan_reply import ScanStub
from service.common import channel_options
from service.common.partition import Partition
from service.common.schema import ColumnType, Schema
from service.common.schema_codec import partition_to_pb, schema_to_pb
from service.common.tls import open_channel
from service.pb import common_pb2 as cpb
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.mini_cluster import MiniCluster

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("score", ColumnType.DOUBLE)],
    key="id",
)


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"row-{i}" for i in ids], pa.string()),
            "score": pa.array([i * 0.5 for i in ids], pa.float64()),
        }
    )


def config_pb(peers: list[tuple[str, str]]) -> mpb.RaftConfigPB:
    c = mpb.RaftConfigPB(opid_index=0)
    for uuid, addr in peers:
        host, _, port = addr.rpartition(":")
        c.peers.add(
            permanent_uuid=uuid,
            member_type=mpb.VOTER,
            last_known_addr=mpb.HostPortPB(host=host, port=int(port)),
        )
    return c


def create_request(
    dest: str, tablet_id: str, peers: list[tuple[str, str]], schema: Schema = SCHEMA
) -> tpb.CreateTabletRequestPB:
    return tpb.CreateTabletRequestPB(
        dest_uuid=dest,
        tablet_id=tablet_id,
        table_id="table-1",
        table_name="t",
        partition=partition_to_pb(Partition((), b"", b"", b"", b"")),
        schema=schema_to_pb(schema),
        partition_schema=cpb.PartitionSchemaPB(range_schema=cpb.RangeSchemaPB()),
        config=config_pb(peers),
    )


def write_request(
    dest: str, tablet_id: str, table: pa.Table, op: int = tpb.ROW_OP_INSERT
) -> tpb.WriteRequestPB:
    return tpb.WriteRequestPB(
        dest_uuid=dest,
        tablet_id=tablet_id,
        rows=ipc(table),
        default_op=tpb.RowOperationTypePB.ValueType(op),
    )


async def scan_all(
    stub: tpb_grpc.TabletServerServiceStub,
    dest: str,
    tablet_id: str,
    *,
    projection: list[str] | None = None,
    predicates: list[tpb.ColumnPredicatePB] | None = None,
    batch_size_bytes: int = 0,
    read_mode: int = tpb.READ_LATEST,
    limit: int = 0,
    snapshot_timestamp: int = 0,
) -> pa.Table:
    ns = tpb.NewScanRequestPB(
        tablet_id=tablet_id,
        projected_columns=projection or [],
        predicates=predicates or [],
        read_mode=tpb.ReadModePB.ValueType(
            tpb.READ_AT_SNAPSHOT if snapshot_timestamp else read_mode
        ),
        limit=limit,
        snapshot_timestamp=snapshot_timestamp,
    )
    resp = await stub.Scan(  # type: ignore[misc]
        tpb.ScanRequestPB(dest_uuid=dest, new_scan=ns, batch_size_bytes=batch_size_bytes)
    )
    tables = [pa.ipc.open_stream(resp.batch).read_all()]
    seq = 0
    while resp.has_more_results:
        seq += 1
        resp = await stub.ScanNext(  # type: ignore[misc]
            tpb.ScanNextRequestPB(
                dest_uuid=dest,
                scanner_id=resp.scanner_id,
                call_seq_id=seq,
                batch_size_bytes=batch_size_bytes,
            )
        )
        tables.append(pa.ipc.open_stream(resp.batch).read_all())
    return pa.concat_tables(tables)


class ClusterStubs:
    """Stubs per server and the little leader discovery these tests need."""

    def __init__(self, cluster: MiniCluster, tablet_id: str) -> None:
        self.cluster = cluster
        self.tablet_id = tablet_id
        self.channels: dict[str, grpc.aio.Channel] = {}

    def _channel(self, uuid: str) -> grpc.aio.Channel:
        ts = self.cluster.tserver_by_uuid(uuid)
        ch = self.channels.get(uuid)
        if ch is None:
            ch = self.channels[uuid] = open_channel(
                ts.address,
                self.cluster.credentials(),
                role="tserver",
                options=channel_options.client(),
            )
        return ch

    def admin(self, uuid: str) -> tpb_grpc.TabletServerAdminServiceStub:
        return tpb_grpc.TabletServerAdminServiceStub(self._channel(uuid))

    def data(self, uuid: str) -> tpb_grpc.TabletServerServiceStub:
        return tpb_grpc.TabletServerServiceStub(self._channel(uuid))

    def scan(self, uuid: str) -> ScanStub:
        """The data service as the client reads it: pages read in place (`ScanReply`)."""
        return ScanStub(self._channel(uuid))

    def forget(self, uuid: str) -> None:
        self.channels.pop(uuid, None)

    async def leader(self, uuids: list[str], timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for u in uuids:
                try:
                    r = await self.admin(u).GetConsensusState(  # type: ignore[misc]
                        tpb.GetConsensusStateRequestPB(dest_uuid=u, tablet_ids=[self.tablet_id]),
                        timeout=1.0,
                    )
                except grpc.aio.AioRpcError:
                    continue
                if r.tablets[0].role == mpb.LEADER:
                    return u
            await asyncio.sleep(0.05)
        raise AssertionError("no tablet leader")

    async def close(self) -> None:
        for ch in self.channels.values():
            await ch.close(None)
