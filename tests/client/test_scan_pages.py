"""The scanner's paging against a scripted tablet server (pure logic: no gRPC): the next page
is asked for while the consumer holds the current one, a failure of that page surfaces only after
the current page's rows and last key, and a consumer that stops early leaves nothing running."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from service.client.scanner import ScanToken, TabletScanner, TokenReplica
from service.common.errors import ServiceUnavailable
from service.pb import tserver_pb2 as tpb

PAGES = 4
ROWS = 3


def _page(k: int) -> bytes:
    batch = pa.record_batch({"k": list(range(k * ROWS, (k + 1) * ROWS))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


class ScriptedServer:
    """Scan and ScanNext answer pages 0..PAGES-1 (the last says no more); `fail_at`: that
    page's ScanNext fails UNAVAILABLE. Records what happened, in order."""

    def __init__(self, events: list[str], fail_at: int = -1) -> None:
        self.events = events
        self.fail_at = fail_at
        self.closed: list[bytes] = []

    def _resp(self, k: int) -> tpb.ScanResponsePB:
        return tpb.ScanResponsePB(
            scanner_id=b"s1",
            batch=_page(k),
            has_more_results=k < PAGES - 1,
            last_primary_key=f"key{k}".encode(),
        )

    async def Scan(self, req: tpb.ScanRequestPB, timeout: float) -> tpb.ScanResponsePB:
        self.events.append("asked 0")
        return self._resp(0)

    async def ScanNext(self, req: tpb.ScanNextRequestPB, timeout: float) -> tpb.ScanResponsePB:
        self.events.append(f"asked {req.call_seq_id}")
        await asyncio.sleep(0)
        if req.call_seq_id == self.fail_at:
            raise ServiceUnavailable("the replica went away")
        return self._resp(req.call_seq_id)

    async def ScanClose(self, req: tpb.ScanCloseRequestPB, timeout: float) -> Any:
        self.closed.append(req.scanner_id)
        return tpb.ScanCloseResponsePB()


def _scanner(server: ScriptedServer) -> TabletScanner:
    client = SimpleNamespace(
        channels=SimpleNamespace(tserver=lambda address: server),
        latest_timestamp=0,
        observe_timestamp=lambda ts: None,
    )
    token = ScanToken((), "t", "t", 0, "tab", (TokenReplica("a", "h:1", True),))
    return TabletScanner(client, token)  # type: ignore[arg-type]


def test_the_next_page_is_asked_for_while_the_consumer_holds_the_current_one() -> None:
    async def main() -> None:
        events: list[str] = []
        server = ScriptedServer(events)
        scanner = _scanner(server)
        rows: list[int] = []
        async for batch in scanner._scan_replica(scanner.token.replicas[0]):
            first = batch.column("k")[0].as_py()
            events.append(f"got {first // ROWS}")
            rows.extend(batch.column("k").to_pylist())
            await asyncio.sleep(0)  # the consumer lets the loop run (SyncClient's always does)
            events.append(f"done {first // ROWS}")
        assert rows == list(range(PAGES * ROWS))
        # Page k+1 is asked for while the consumer holds page k; never two ahead.
        assert events == [
            "asked 0",
            "got 0",
            "asked 1",
            "done 0",
            "got 1",
            "asked 2",
            "done 1",
            "got 2",
            "asked 3",
            "done 2",
            "got 3",
            "done 3",
        ]
        assert scanner.last_key == b"key3" and server.closed == []

    asyncio.run(main())


def test_a_failed_page_read_ahead_surfaces_after_the_page_before_it() -> None:
    async def main() -> None:
        events: list[str] = []
        server = ScriptedServer(events, fail_at=2)
        scanner = _scanner(server)
        rows: list[int] = []
        with pytest.raises(ServiceUnavailable):
            async for batch in scanner._scan_replica(scanner.token.replicas[0]):
                rows.extend(batch.column("k").to_pylist())
        # Pages 0 and 1 were handed out whole and page 1's last key kept: a resumed scan
        # starts right after them.
        assert rows == list(range(2 * ROWS))
        assert scanner.rows_returned == 2 * ROWS and scanner.last_key == b"key1"
        assert server.closed == [b"s1"]

    asyncio.run(main())


def test_a_consumer_that_stops_early_cancels_the_page_read_ahead_and_closes_the_scanner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        for fail_at in (-1, 1):  # the page read ahead pending, or failed unseen
            server = ScriptedServer([], fail_at=fail_at)
            scanner = _scanner(server)
            pages = scanner._scan_replica(scanner.token.replicas[0])
            await pages.__anext__()
            await asyncio.sleep(0.01)
            await pages.aclose()
            assert server.closed == [b"s1"]
        await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(main())
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
