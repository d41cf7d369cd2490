"""ScannerManager in-process: pages, read-ahead, page sizes changing between calls, the row
limit, retries (also of a call cancelled while its page was built) and the wire form."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from service.common.errors import InvalidArgument, NotFound
from service.common.schema import ColumnType, Schema
from service.pb import tserver_pb2 as tpb
from service.tserver.scanners import (
    ScannerManager,
    ScanPage,
    add_data_servicer,
    serialize_scan_response,
)

SCHEMA = Schema.build([("id", ColumnType.INT64), ("s", ColumnType.STRING)], "id")
ARROW = SCHEMA.to_arrow()


def batches(n: int, size: int) -> list[pa.RecordBatch]:
    return [
        pa.RecordBatch.from_pydict(
            {
                "id": list(range(lo, min(lo + size, n))),
                "s": [f"v{i:06d}" for i in range(lo, min(lo + size, n))],
            },
            schema=ARROW,
        )
        for lo in range(0, n, size)
    ]


def ids(pages: list[ScanPage]) -> list[int]:
    out: list[int] = []
    for p in pages:
        t = pa.ipc.open_stream(p.to_pb().batch).read_all()
        assert t.schema.equals(ARROW)
        out.extend(t.column("id").to_pylist())
    return out


async def scan(
    m: ScannerManager, it: Iterator[pa.RecordBatch], sizes: list[int], limit: int = 0
) -> list[ScanPage]:
    """Pages of a scan whose i-th call asks for sizes[i] bytes (the last size repeats)."""
    key = (SCHEMA.column("id"),)
    pages = [await m.open("t1", ARROW, it, key, 7, 1, limit, sizes[0])]
    seq = 0
    while pages[-1].has_more_results:
        seq += 1
        sid = pages[-1].to_pb().scanner_id
        pages.append(await m.next(sid, seq, sizes[min(seq, len(sizes) - 1)]))
    return pages


def run(coro_fn: object) -> None:
    assert callable(coro_fn)
    asyncio.run(coro_fn())


def test_pages_cover_every_row_once_in_order_whatever_the_page_sizes() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        one_batch = batches(1000, 1000)[0].nbytes
        for sizes in (
            [0],
            [4096],
            [one_batch // 3],
            [one_batch // 2, 1, one_batch * 4, 64, 1 << 20],
        ):
            pages = await scan(m, iter(batches(5000, 1000)), sizes)
            assert ids(pages) == list(range(5000)), sizes
            assert all(p.rows for p in pages), "no empty page: the last rows say it is the end"
            last = pages[-1].to_pb()
            assert not last.scanner_id and not last.has_more_results
            assert last.applied_index == 7 and last.schema_version == 1
        assert m.scanners == {} or all(s.finished for s in m.scanners.values())

    run(main)


def test_read_ahead_builds_the_next_page_before_it_is_asked_for() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        pulled: list[int] = []
        ready = threading.Event()

        def source() -> Iterator[pa.RecordBatch]:
            for b in batches(3000, 1000):
                pulled.append(b.num_rows)
                if len(pulled) == 3:
                    ready.set()
                yield b

        one = batches(1000, 1000)[0].nbytes
        first = await m.open("t1", ARROW, source(), (SCHEMA.column("id"),), 1, 1, 0, one)
        assert first.rows == 1000 and first.has_more_results
        # The second page (and the peek that finds the end) happens with no call pending.
        assert await asyncio.to_thread(ready.wait, 5)
        await asyncio.sleep(0.05)
        sid = first.to_pb().scanner_id
        (s,) = m.scanners.values()
        assert s.ahead is not None and s.ahead.done()
        second = await m.next(sid, 1, one)
        third = await m.next(sid, 2, one)
        assert (second.rows, third.rows, third.has_more_results) == (1000, 1000, False)

    run(main)


def test_a_new_page_size_applies_from_the_page_after_the_one_built_ahead() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        pages = await scan(m, iter(batches(5000, 1000)), [64, 64, 1 << 20])
        # Page 2 was built ahead with 64 bytes and is sent as it is (a page may be smaller
        # than asked); the page built after it, for the 1 MiB call, holds the rest.
        assert [p.rows for p in pages] == [3, 3, 3, 4991]
        pages = await scan(m, iter(batches(5000, 1000)), [20_000, 20_000, 100, 1 << 20])
        # Page 3 was built ahead for a larger call: its rows are cut again for this one.
        assert ids(pages) == list(range(5000))
        assert [p.rows for p in pages[:4]] == [1052, 1052, 5, 5]  # 20_000 // 19 bytes a row

    run(main)


def test_row_limit_with_read_ahead() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        pages = await scan(m, iter(batches(5000, 700)), [1], limit=1234)
        assert ids(pages) == list(range(1234))
        pages = await scan(m, iter(batches(5000, 700)), [1 << 20], limit=1400)
        assert ids(pages) == list(range(1400)) and len(pages) == 1

    run(main)


def test_retry_and_sequence_errors() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        key = (SCHEMA.column("id"),)
        one = batches(1000, 1000)[0].nbytes
        first = await m.open("t1", ARROW, iter(batches(3000, 1000)), key, 1, 1, 0, one)
        sid = first.to_pb().scanner_id
        a = await m.next(sid, 1, one)
        assert (await m.next(sid, 1, one)).wire == a.wire  # a retry of the last call
        with pytest.raises(InvalidArgument):
            await m.next(sid, 3, one)
        last = await m.next(sid, 2, one)
        assert not last.has_more_results
        assert (await m.next(sid, 2, one)).wire == last.wire  # the last page, again
        with pytest.raises(NotFound):
            await m.next(sid, 3, one)
        m.close(sid)
        with pytest.raises(NotFound):
            await m.next(sid, 2, one)

    run(main)


def test_a_call_cancelled_while_its_page_is_built_leaves_the_page_for_its_retry() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        gate = threading.Event()

        def source() -> Iterator[pa.RecordBatch]:
            bs = batches(4000, 1000)
            yield from bs[:3]
            gate.wait(5)  # the peek after the third page (built ahead) blocks here
            yield bs[3]

        one = batches(1000, 1000)[0].nbytes
        first = await m.open("t1", ARROW, source(), (SCHEMA.column("id"),), 1, 1, 0, one)
        sid = first.to_pb().scanner_id
        second = await m.next(sid, 1, one)
        call = asyncio.create_task(m.next(sid, 2, one))
        await asyncio.sleep(0.1)
        assert not call.done()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        gate.set()
        third = await m.next(sid, 2, one)  # the retry gets the page the cancelled call built
        fourth = await m.next(sid, 3, one)
        assert ids([first, second, third, fourth]) == list(range(4000))
        assert not fourth.has_more_results

    run(main)


def test_expired_and_closed_scanners_drop_their_read_ahead() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=0.1)
        await m.start()
        try:
            first = await scan_open(m)
            sid = first.to_pb().scanner_id
            await asyncio.sleep(0.4)
            with pytest.raises(NotFound):
                await m.next(sid, 1, 1)
            assert m.expired == 1
            second = await scan_open(m)
            (s,) = m.scanners.values()
            m.close(second.to_pb().scanner_id)
            assert m.scanners == {} and s.ahead is None
        finally:
            await m.aclose()

    async def scan_open(m: ScannerManager) -> ScanPage:
        return await m.open(
            "t1", ARROW, iter(batches(3000, 1000)), (SCHEMA.column("id"),), 1, 1, 0, 1
        )

    run(main)


def test_wire_form_is_an_ordinary_scan_response() -> None:
    async def main() -> None:
        m = ScannerManager(ttl_s=60)
        page = await m.open("t1", ARROW, iter(batches(100, 50)), (SCHEMA.column("id"),), 9, 3, 0, 0)
        resp = tpb.ScanResponsePB.FromString(serialize_scan_response(page))
        assert resp.applied_index == 9 and resp.schema_version == 3 and not resp.has_more_results
        assert pa.ipc.open_stream(resp.batch).read_all().num_rows == 100
        assert len(resp.batch) == page.batch_bytes
        assert resp.last_primary_key  # the encoded key of id 99
        plain = tpb.ScanResponsePB(applied_index=1)
        assert serialize_scan_response(plain) == plain.SerializeToString()
        assert m.bytes_sent == page.batch_bytes and m.pages_sent == 1

    run(main)


def test_add_data_servicer_swaps_only_the_scan_serializers() -> None:
    registered: dict[str, object] = {}

    class FakeServer:
        def add_generic_rpc_handlers(self, handlers: object) -> None:
            registered["generic"] = handlers

        def add_registered_method_handlers(self, name: str, handlers: dict[str, object]) -> None:
            registered[name] = handlers

    from service.pb import tserver_pb2_grpc as tpb_grpc

    add_data_servicer(tpb_grpc.TabletServerServiceServicer(), FakeServer())
    handlers = registered["tessera.tserver.TabletServerService"]
    assert isinstance(handlers, dict)
    assert handlers["Scan"].response_serializer is serialize_scan_response
    assert handlers["ScanNext"].response_serializer is serialize_scan_response
    assert handlers["Write"].response_serializer is tpb.WriteResponsePB.SerializeToString
    assert "generic" in registered


def test_a_page_is_a_fresh_bytes_object_of_exactly_its_size_for_every_page_size() -> None:
    """Pages are written straight into the bytes object gRPC sends (`_new_bytes`): each is a
    distinct object, exactly as long as the message, and decodes to the rows, whatever the
    page size (a one-row page, a page of many batches, an empty last page)."""

    async def main() -> None:
        for n, batch_rows, page_bytes in ((0, 10, 0), (1, 1, 1), (1000, 7, 2_000), (3000, 1000, 0)):
            m = ScannerManager(ttl_s=60)
            pages = await scan(m, iter(batches(n, batch_rows)), [page_bytes])
            assert ids(pages) == list(range(n))
            wires = [p.wire for p in pages]
            assert len({id(w) for w in wires}) == len(wires)
            for p in pages:
                assert type(p.wire) is bytes
                pb = tpb.ScanResponsePB.FromString(p.wire)
                assert len(pb.batch) == p.batch_bytes
                assert len(p.wire) == pb.ByteSize()  # nothing more than the message

    run(main)
