"""SplitKeyRange and `split_token` against real processes: 3 masters and 3 tablet servers.

Split tokens' proofs: they tile each tablet and together read exactly the rows of the
unsplit scan, in chunks near the target size; planning opens no scanner (the tablet servers'
scan counters do not move, their SplitKeyRange counters do); bad requests get their gRPC status
through the real servicer; followers answer, and the client fails over when a replica is down.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import grpc
import grpc.aio
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from service.client import TesseraClient
from service.client.scanner import ScanToken, TokenReplica
from service.common.errors import InvalidArgument, TesseraError
from service.common.keys import encode_key
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc
from service.testing.mini_cluster import MiniCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SCHEMA = Schema.build(
    [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("score", ColumnType.DOUBLE)],
    key="id",
)
# Two tablets: [.., 130k) gets a flushed file (100k rows trigger a flush) plus a memstore with
# updates and deletes over it; [130k, ..) only a memstore.
PARTITIONING = PartitionSchema(range=RangeSchema(("id",)), split_rows=((130_000,),))
TARGET = 10_000


def data(lo: int, hi: int, tag: str = "") -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}{tag}" for i in ids], pa.string()),
            "score": pa.array([i / 4 for i in ids], pa.float64()),
        }
    )


def metrics(cluster: MiniCluster) -> tuple[Counter[str], int]:
    """(scans started per tablet, SplitKeyRange calls answered OK), over every tablet server."""
    scans: Counter[str] = Counter()
    splits = 0
    for ts in cluster.tservers.values():
        if not ts.alive:
            continue
        with urllib.request.urlopen(f"http://{ts.http_address}/metrics", timeout=10) as r:
            text = r.read().decode()
        for m in re.finditer(r'^tessera_tablet_scans_total\{group="([^"]+)"\} (\S+)$', text, re.M):
            scans[m.group(1)] += int(float(m.group(2)))
        for m in re.finditer(r"^tessera_rpc_requests_total\{(.*)\} (\S+)$", text, re.M):
            if 'method="SplitKeyRange"' in m.group(1) and 'code="OK"' in m.group(1):
                splits += int(float(m.group(2)))
    return scans, splits


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MiniCluster]:
    with MiniCluster(tmp_path_factory.mktemp("split")) as c:

        async def load() -> None:
            async with TesseraClient(
                c.master_addresses, timeout=60, credentials=c.credentials()
            ) as client:
                await client.create_table("t", SCHEMA, PARTITIONING, num_replicas=3)
                for lo in range(0, 160_000, 40_000):
                    r = await client.write("t", data(lo, lo + 40_000), "insert")
                    assert r.errors == []
                await client.write("t", data(100_000, 110_000, "u"), "upsert")
                await client.write("t", data(20_000, 30_000).select(["id"]), "delete")

        asyncio.run(load())
        yield c


def expected() -> pa.Table:
    t = pa.concat_tables([data(0, 20_000), data(30_000, 100_000), data(100_000, 110_000, "u")])
    return pa.concat_tables([t, data(110_000, 160_000)])


def sort(t: pa.Table) -> pa.Table:
    t = t.sort_by("id")
    return t.cast(pa.schema([f.with_nullable(True) for f in t.schema]))


async def scan_all(c: TesseraClient, tokens: list[ScanToken]) -> tuple[pa.Table, list[int]]:
    parts = [
        pa.Table.from_batches([b async for b in c.scan_batches(t)], SCHEMA.to_arrow())
        for t in tokens
    ]
    return pa.concat_tables(parts), [p.num_rows for p in parts]


def test_split_tokens_tile_tablets_read_exactly_and_scan_nothing(cluster: MiniCluster) -> None:
    async def main() -> None:
        async with TesseraClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as c:
            tokens = await c.scan_tokens("t")
            assert len(tokens) == 2
            # The layout the split reads: the first tablet has a flushed file on every replica
            # (plus a memstore with updates and deletes), the second only a memstore.
            for tok, files in zip(tokens, (1, 0), strict=True):
                for ts in cluster.tservers.values():
                    deadline = time.monotonic() + 20  # a follower may still be flushing
                    while True:
                        found = list(ts.data_dir.glob(f"tablets/{tok.tablet_id}/data/rs-*.arrow"))
                        if len(found) == files or time.monotonic() > deadline:
                            break
                        await asyncio.sleep(0.1)
                    assert len(found) == files, (ts.name, found)
            scans_before, splits_before = metrics(cluster)
            t0 = time.perf_counter()
            pieces = [await c.split_token(t, TARGET) for t in tokens]
            planning = time.perf_counter() - t0
            scans_after, splits_after = metrics(cluster)
            # Planning asked each tablet once and opened no scanner anywhere.
            assert scans_after == scans_before
            assert splits_after - splits_before == len(tokens)
            assert planning < 5, planning

            for tok, ps in zip(tokens, pieces, strict=True):
                assert ps[0].lower_key == tok.lower_key and ps[-1].upper_key == tok.upper_key
                assert all(a.upper_key == b.lower_key for a, b in itertools.pairwise(ps))
                assert all(a.lower_key < a.upper_key for a in ps[1:-1])
                assert {p.tablet_id for p in ps} == {tok.tablet_id}
            # 120k live rows in the first tablet, 30k in the second.
            assert [len(ps) for ps in pieces] == [12, 3]

            flat = [p for ps in pieces for p in ps]
            got, sizes = await scan_all(c, flat)
            scans_read, _ = metrics(cluster)  # the counter does count: one scan per piece
            assert scans_read - scans_after == Counter(p.tablet_id for p in flat)
            unsplit, _ = await scan_all(c, tokens)
            assert got.num_rows == unsplit.num_rows == 150_000
            assert sort(got).equals(sort(unsplit))
            assert sort(got).equals(expected())
            assert all(TARGET // 2 <= n <= TARGET * 3 // 2 for n in sizes), sizes

            # The estimates behind the split: per chunk, near the real sizes.
            split = await c.split_key_range(tokens[0], target_rows=TARGET)
            assert len(split.chunk_rows) == 12 == len(split.split_keys) + 1
            assert abs(sum(split.chunk_rows) - 120_000) <= 12_000
            assert all(b > 0 for b in split.chunk_bytes)
            # A byte target over the projection: ids only (8 B a row) make far fewer chunks
            # than every column for the same budget.
            by_bytes = await c.split_token(tokens[0], 0, bytes_per_split=400_000)
            ids_only = replace(tokens[0], projection=("id",))
            assert len(await c.split_token(ids_only, 0, bytes_per_split=400_000)) < len(by_bytes)

            # A piece can be split again: its bounds are passed on and respected.
            sub = await c.split_token(pieces[0][3], 2_500)
            assert sub[0].lower_key == pieces[0][3].lower_key
            assert sub[-1].upper_key == pieces[0][3].upper_key
            got, _ = await scan_all(c, sub)
            one, _ = await scan_all(c, [pieces[0][3]])
            assert sort(got).equals(sort(one)) and len(sub) == 4

    asyncio.run(main())


class Status:
    """The gRPC status and details a failed call ended with, read off its TesseraError."""

    def __init__(self, err: TesseraError) -> None:
        self.err = err

    def code(self) -> grpc.StatusCode | None:
        return self.err.rpc_status

    def details(self) -> str | None:
        return self.err.rpc_details


def test_bad_requests_get_their_status(cluster: MiniCluster) -> None:
    async def main() -> None:
        async with TesseraClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as c:
            (tok, _) = await c.scan_tokens("t")
            rep = tok.replicas[0]
            stub = tpb_grpc.TabletServerServiceStub(c.channels.channel(rep.address))

            async def call(**kw: Any) -> Status:
                fields = {"dest_uuid": rep.ts_uuid, "tablet_id": tok.tablet_id, **kw}
                req = tpb.SplitKeyRangeRequestPB(**fields)
                # The client's channels raise TesseraErrors that keep the call's status.
                with pytest.raises(TesseraError) as e:
                    await stub.SplitKeyRange(req, timeout=10)
                return Status(e.value)

            e = await call(tablet_id="no-such-tablet", target_chunk_rows=10)
            assert e.code() is grpc.StatusCode.NOT_FOUND
            e = await call(target_chunk_rows=0)
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "target_chunk_rows" in (e.details() or "")
            e = await call(target_chunk_rows=-3)
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "target_chunk_rows" in (e.details() or "")
            e = await call(target_chunk_bytes=-1, target_chunk_rows=5)
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "target_chunk_bytes" in (e.details() or "")
            k = encode_key(SCHEMA.key_columns, [5])
            for start, stop in [(k, k), (encode_key(SCHEMA.key_columns, [9]), k)]:
                e = await call(target_chunk_rows=5, start_primary_key=start, stop_primary_key=stop)
                assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
                assert "start_primary_key" in (e.details() or "")
            e = await call(target_chunk_rows=5, columns=["id", "nope"])
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert "nope" in (e.details() or "")
            e = await call(target_chunk_rows=5, dest_uuid="someone-else")
            assert e.code() is grpc.StatusCode.FAILED_PRECONDITION

            # Through the client: the same errors, as the same classes.
            with pytest.raises(InvalidArgument, match="target_chunk_rows"):
                await c.split_key_range(tok, target_rows=0)
            with pytest.raises(InvalidArgument, match="rows_per_split"):
                await c.split_token(tok, 0)

    asyncio.run(main())


def test_followers_answer_and_the_client_fails_over(cluster: MiniCluster) -> None:
    async def main() -> None:
        async with TesseraClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as c:
            tok, _ = await c.scan_tokens("t")
            assert len(tok.replicas) == 3
            # Every replica answers, leader or follower, once it has applied the writes.
            for rep in tok.replicas:
                alone = replace(tok, replicas=(rep,))
                deadline = time.monotonic() + 20
                while True:
                    split = await c.split_key_range(alone, target_rows=TARGET)
                    if (
                        abs(sum(split.chunk_rows) - 120_000) <= 12_000
                        or time.monotonic() > deadline
                    ):
                        break
                    await asyncio.sleep(0.2)
                assert split.ts_uuid == rep.ts_uuid
                assert len(split.split_keys) == 11, (rep, split.chunk_rows)

            # A replica nobody listens at comes first: the next one answers.
            dead = TokenReplica("ts-gone", "127.0.0.1:1", True)
            bad_first = replace(
                tok, replicas=(dead, *(replace(r, is_leader=False) for r in tok.replicas))
            )
            split = await c.split_key_range(bad_first, target_rows=TARGET)
            assert split.ts_uuid == tok.replicas[0].ts_uuid
            # The tablet's leader is killed: planning still works (a follower answers at once),
            # and the pieces read exactly what the tablet holds (scans fail over too).
            leader = next(r for r in tok.replicas if r.is_leader)
            cluster.kill_tserver(cluster.tserver_by_uuid(leader.ts_uuid).name)
            pieces = await c.split_token(tok, TARGET)
            assert len(pieces) == 12
            got, _ = await scan_all(c, pieces)
            everything = expected()
            want = everything.filter(pc.less(everything["id"], 130_000))
            assert sort(got).equals(want)

    asyncio.run(main())
