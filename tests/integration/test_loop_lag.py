"""No request stalls a master or a tablet server: while the largest accepted request of each
kind runs, no server's event loop wakes later than its Raft heartbeat interval because of work
on it.

Masters: a CreateTable of 60 tablets, a 300-step AlterTable, lookups of all its locations.
Tablet servers: a client write fanned out to 60 tablets that each server hosts a replica of
(their applies take turns on the loop, service/consensus/turns.py), and the largest single
Write a tablet server accepts (service/tserver/row_ops.py, MAX_WRITE_BYTES of MAX_WRITE_ROWS
rows) sent to one tablet's leader as it is, together with the refusal of one just larger.

What is counted is `tessera_event_loop_busy_stalls_total` on each server's /metrics: wake-ups
later than the bound during which the loop's own thread used more CPU time than the bound
(service/common/loop_lag.py). The plain stall counter also moves when the machine does not run
the server at all, and on the shared 2-core test machine (load averages of 10-20 while other
suites run) it does, for old and new code alike, so holding the test to it would make it
fail at random; what a request's work on the loop costs is counted the same however slowly the
machine runs. Plain stalls and the largest lag are printed with any failure.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.client.meta_cache import TabletLocation
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.master.ddl_checks import MAX_ALTER_STEPS
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.mini_cluster import MiniCluster
from service.tserver.row_ops import MAX_WRITE_BYTES, MAX_WRITE_ROWS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HEARTBEAT_S = 0.5  # conf/master.toml and conf/tserver.toml: raft.heartbeat_interval_ms
SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
FAN_OUT = 60
"""Tablets of the fanned-out write; with 3 replicas on 3 servers, every server hosts all."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    # The product's Raft timing, not the tests' fast one: the bound is its heartbeat interval.
    with MiniCluster(
        tmp_path_factory.mktemp("lag"),
        master_overrides={},
        tserver_overrides={"heartbeat_interval_ms": "200"},
    ) as c:
        yield c


def _loop_metrics(http_address: str) -> dict[str, float]:
    """The server's event-loop counters so far (service/common/loop_lag.py)."""
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=5) as r:
        body = r.read().decode()
    out = {}
    for line in body.splitlines():
        name, _, value = line.partition(" ")
        if name in (
            "tessera_event_loop_stalls_total",
            "tessera_event_loop_busy_stalls_total",
            "tessera_event_loop_lag_max_seconds",
        ):
            out[name.removeprefix("tessera_event_loop_")] = float(value)
    assert len(out) == 3, f"event-loop metrics missing on /metrics: {out}"
    return out


class LoopWatch:
    """The servers' loop counters before and after a request."""

    def __init__(self, addresses: list[str]) -> None:
        assert all(addresses)
        self.addresses = addresses
        self.before = {a: _loop_metrics(a) for a in addresses}

    def check(self, what: str) -> None:
        after = {a: _loop_metrics(a) for a in self.addresses}
        moved = {
            a: {k: after[a][k] - self.before[a][k] for k in ("busy_stalls_total", "stalls_total")}
            | {"lag_max_seconds (last 60 s)": after[a]["lag_max_seconds"]}
            for a in self.addresses
        }
        assert not any(m["busy_stalls_total"] for m in moved.values()), (
            f"{what}: loop stalls over {HEARTBEAT_S} s caused by work on the loop: {moved}"
        )


def test_the_largest_catalog_requests_do_not_stall_a_master(cluster: MiniCluster) -> None:
    watch = LoopWatch([m.http_address for m in cluster.masters.masters.values()])
    with cluster.client(timeout=300) as c:
        ps = PartitionSchema(hash=(HashBucketSchema(("id",), 60),))
        c.call("create_table", "wide", SCHEMA, ps, num_replicas=3)
        c.call(
            "alter_table",
            "wide",
            [AddColumn(f"c{i}", ColumnType.INT64) for i in range(MAX_ALTER_STEPS - 2)],
        )
        for _ in range(20):
            c.call("open_table", "wide", refresh=True)
            c.scan_tokens("wide")
    watch.check("the largest catalog requests")


def _rows(start: int, n: int, width: int) -> pa.Table:
    ids = pa.array(range(start, start + n), pa.int64())
    text = pc.utf8_lpad(pc.cast(ids, pa.string()), width=width, padding="0")
    return pa.table({"id": ids, "v": text})


def _tservers(cluster: MiniCluster) -> list[str]:
    return [ts.http_address for ts in cluster.tservers.values()]


def test_a_write_fanned_out_to_every_tablet_of_a_server_does_not_stall_it(
    cluster: MiniCluster,
) -> None:
    rows = FAN_OUT * 10_000
    with cluster.client(timeout=300) as c:
        ps = PartitionSchema(hash=(HashBucketSchema(("id",), FAN_OUT),))
        c.call("create_table", "fan", SCHEMA, ps, num_replicas=3)
        data = _rows(0, rows, 16)

        async def write() -> int:
            # Every tablet's batch in flight at once: all 60 commit together on each server.
            session = await c.client.new_session(
                "fan", max_tablets_in_flight=FAN_OUT, max_buffered_rows=rows
            )
            await session.apply(data, "insert")
            await session.flush()
            return session.result.rows_applied

        c.write("fan", _rows(-1, 1, 16))  # leaders elected, locations cached
        watch = LoopWatch(_tservers(cluster))
        assert c.run(write()) == rows
        time.sleep(2)  # followers apply just after the leaders: within the window
    watch.check(f"a write of {rows} rows fanned out to {FAN_OUT} tablets")


async def _write_to_leader(
    cluster: MiniCluster, loc: TabletLocation, rows: bytes
) -> tpb.WriteResponsePB:
    """`rows` as one Write to the tablet's leader, as it is (no client cutting it up)."""
    deadline = time.monotonic() + 60
    while True:
        for replica in loc.replicas:
            async with cluster.channel(replica.address) as ch:
                req = tpb.WriteRequestPB(
                    dest_uuid=replica.ts_uuid,
                    tablet_id=loc.tablet_id,
                    rows=rows,
                    default_op=tpb.ROW_OP_INSERT,
                )
                try:
                    resp: tpb.WriteResponsePB = await tpb_grpc.TabletServerServiceStub(ch).Write(
                        req, timeout=60
                    )
                    return resp
                except grpc.aio.AioRpcError as e:
                    if e.code() is not grpc.StatusCode.UNAVAILABLE:  # not the leader
                        raise
        assert time.monotonic() < deadline, "no leader answered"
        await asyncio.sleep(0.2)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def test_the_largest_accepted_write_does_not_stall_a_tablet_server(cluster: MiniCluster) -> None:
    with cluster.client(timeout=300) as c:
        ps = PartitionSchema(range=RangeSchema(("id",)))
        c.call("create_table", "big", SCHEMA, ps, num_replicas=3)
        c.write("big", _rows(-1, 1, 16))  # a leader elected
        (loc,) = c.call("table_locations", "big")
        # As many rows as a Write may carry, as wide as fill MAX_WRITE_BYTES.
        width = MAX_WRITE_BYTES // MAX_WRITE_ROWS - 8
        while len(payload := _ipc(_rows(0, MAX_WRITE_ROWS, width))) > MAX_WRITE_BYTES:
            width -= 1
        assert len(payload) > MAX_WRITE_BYTES * 0.99

        # One byte or one row more is refused, naming the limit, and changes nothing.
        too_big = _ipc(_rows(0, MAX_WRITE_ROWS, width + 1))
        too_many = _ipc(_rows(0, MAX_WRITE_ROWS + 1, 1))
        for bad, limit in ((too_big, f"{MAX_WRITE_BYTES} one Write"), (too_many, "rows, more")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                asyncio.run(_write_to_leader(cluster, loc, bad))
            assert err.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert limit in (err.value.details() or "")
        assert c.call("scan", "big").num_rows == 1

        watch = LoopWatch(_tservers(cluster))
        resp = asyncio.run(_write_to_leader(cluster, loc, payload))
        assert resp.rows_applied == MAX_WRITE_ROWS and not resp.per_row_errors
        time.sleep(2)  # followers apply just after the leader: within the window
    watch.check(f"one Write of {MAX_WRITE_ROWS} rows, {len(payload)} bytes")
