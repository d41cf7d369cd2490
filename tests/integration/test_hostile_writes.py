"""Poison writes against real processes: Arrow streams that frame correctly but lie about their
data (offsets outside the buffer, invalid UTF-8, null counts, dictionary indices).

One such stream of about 600 bytes, sent to a tablet leader, was appended to the log and then
crashed every replica on apply and again on every restart while replaying it. Each is now
refused with INVALID_ARGUMENT before it is replicated: every server stays up, the tablet's rows
and every replica's checksum are unchanged, and the next good write is applied. The client
refuses such a table itself, before routing touches its rows.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.errors import InvalidArgument
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.hostile_arrow import POISONS
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

KV = Schema.build([("k", ColumnType.INT64), ("v", ColumnType.STRING)], key="k")


def _good(lo: int, hi: int) -> pa.Table:
    return pa.table(
        {"k": pa.array(range(lo, hi), pa.int64()), "v": [f"value-{i}" for i in range(lo, hi)]}
    )


async def _send_to_every_replica(
    cluster: MiniCluster, replicas: list[tuple[str, str]], tablet_id: str, rows: bytes
) -> list[grpc.StatusCode]:
    codes = []
    for uuid, address in replicas:
        async with cluster.channel(address) as ch:
            stub = tpb_grpc.TabletServerServiceStub(ch)
            req = tpb.WriteRequestPB(
                dest_uuid=uuid, tablet_id=tablet_id, rows=rows, default_op=tpb.ROW_OP_UPSERT
            )
            try:
                await stub.Write(req, timeout=15)
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as e:
                codes.append(e.code())
                if e.code() is grpc.StatusCode.INVALID_ARGUMENT:
                    assert "invalid Arrow data" in (e.details() or ""), e.details()
    return codes


def _checksums(client: SyncClient, cluster: MiniCluster, tablet_id: str) -> set[tuple[int, bytes]]:
    async def one(uuid: str, address: str) -> tuple[int, bytes]:
        async with cluster.channel(address) as ch:
            r = await tpb_grpc.TabletServerServiceStub(ch).Checksum(
                tpb.ChecksumRequestPB(dest_uuid=uuid, tablet_id=tablet_id), timeout=30
            )
            return (r.row_count, r.digest)

    return {asyncio.run(one(ts.uuid, ts.address)) for ts in cluster.tservers.values() if ts.alive}


def test_poison_writes_are_refused_and_nothing_changes(tmp_path: Path) -> None:
    with (
        MiniCluster(tmp_path) as cluster,
        SyncClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as client,
    ):
        client.call(
            "create_table", "poison", KV, PartitionSchema(range=RangeSchema(("k",))), num_replicas=3
        )
        assert client.write("poison", _good(0, 100), "insert").rows_applied == 100
        (token,) = client.scan_tokens("poison")
        replicas = [(r.ts_uuid, r.address) for r in token.replicas]
        assert len(replicas) == 3

        for name, make in sorted(POISONS.items()):
            # Followers answer "not the leader" (UNAVAILABLE); during an election every replica
            # may, so a poison is sent until the leader has judged it (never applied).
            deadline = time.monotonic() + 30
            while True:
                codes = asyncio.run(
                    _send_to_every_replica(cluster, replicas, token.tablet_id, make())
                )
                assert grpc.StatusCode.OK not in codes, (name, codes)
                if grpc.StatusCode.INVALID_ARGUMENT in codes or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert grpc.StatusCode.INVALID_ARGUMENT in codes, (name, codes)

            # Through the client: refused locally, naming the problem.
            poisoned = pa.ipc.open_stream(make()).read_all()
            with pytest.raises(InvalidArgument, match="invalid Arrow data"):
                client.write("poison", poisoned, "upsert")

        assert all(ts.alive for ts in cluster.tservers.values())
        got = pa.Table.from_batches(list(client.scan_batches(client.scan_tokens("poison")[0])))
        assert got.sort_by("k").to_pydict() == _good(0, 100).to_pydict()
        # The next good write is applied, and every replica holds the same rows.
        assert client.write("poison", _good(100, 150), "insert").rows_applied == 50
        deadline = time.monotonic() + 30  # followers apply a moment after the leader answers
        while (sums := _checksums(client, cluster, token.tablet_id)) != {
            next(iter(sums))
        } and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(sums) == 1 and next(iter(sums))[0] == 150

        # Restarted, each server replays its log without trouble: nothing bad was appended.
        for name in list(cluster.tservers):
            cluster.kill_tserver(name)
            cluster.start_tserver(name)
        got = pa.Table.from_batches(list(client.scan_batches(client.scan_tokens("poison")[0])))
        assert got.num_rows == 150
        assert all(ts.alive for ts in cluster.tservers.values())
