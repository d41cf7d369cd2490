"""Scanners: paged scans of one tablet, each named by a scanner id and expired when idle.

Theory of operation
-------------------
`Scan` opens a scanner over a consistent snapshot of the tablet (`RowStore.scan_with_keys`
reads the state at the moment it is called) and returns the first page; `ScanNext` returns the
following ones; the last page carries `has_more_results = false` and the scanner is gone.
A page is an Arrow IPC stream of whole record batches, cut at `batch_size_bytes` (at least one
batch, so a huge row still makes progress).

Retries: every ScanNext names its `call_seq_id` (1, 2, ...). A retry of the last call (same
number: the client did not get the answer) is answered with the same page again, kept for that
purpose; any other number is refused, since pages cannot be re-read once the iterator moved on.
Each page carries the encoded key of its last row, so a client that lost the scanner (expired,
or the server died) resumes on any replica with `start_after_primary_key`.

Idle scanners expire after `ttl_s` (a sweep every ttl/4), so a client that vanished does not
pin a snapshot forever. Pulling batches from the iterator runs in a worker thread: decoding and
filtering files must not stall the event loop that runs Raft for every tablet on the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from service.common.errors import InvalidArgument, NotFound
from service.common.keys import encode_keys_arrow
from service.common.schema import ColumnSchema
from service.pb import tserver_pb2 as tpb

log = logging.getLogger(__name__)

DEFAULT_BATCH_BYTES = 2 << 20
"""Below gRPC's default 4 MB message limit, so a client with default channel options can scan."""
MAX_BATCH_BYTES = 64 << 20


@dataclass
class Scanner:
    id: bytes
    tablet_id: str
    schema: pa.Schema
    it: Iterator[pa.RecordBatch]
    """Batches of the projection plus any key column it lacks (to know each page's last key)."""
    key_cols: tuple[ColumnSchema, ...]
    applied_index: int
    schema_version: int
    limit: int
    last_used: float = field(default_factory=time.monotonic)
    call_seq: int = 0
    last_page: tpb.ScanResponsePB | None = None
    rows_returned: int = 0
    pending: pa.RecordBatch | None = None
    finished: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ScannerManager:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.scanners: dict[bytes, Scanner] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.expired = 0
        self.opened = 0
        self.opened_by_tablet: Counter[str] = Counter()
        """Scans started per tablet, for /metrics (proves partition pruning in tests)."""
        self.pages_sent = 0
        self.bytes_sent = 0
        """Arrow IPC bytes of every page sent (retries of a page not counted), for /metrics."""

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="scanner-sweeper")

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        self.scanners.clear()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.ttl_s / 4))
            now = time.monotonic()
            for sid, s in list(self.scanners.items()):
                if now - s.last_used > self.ttl_s and not s.lock.locked():
                    del self.scanners[sid]
                    self.expired += 1
                    log.info("scanner %s on %s expired", sid.hex(), s.tablet_id)

    async def open(
        self,
        tablet_id: str,
        schema: pa.Schema,
        it: Iterator[pa.RecordBatch],
        key_cols: tuple[ColumnSchema, ...],
        applied_index: int,
        schema_version: int,
        limit: int,
        batch_bytes: int,
    ) -> tpb.ScanResponsePB:
        s = Scanner(
            os.urandom(16), tablet_id, schema, it, key_cols, applied_index, schema_version, limit
        )
        self.scanners[s.id] = s
        self.opened += 1
        self.opened_by_tablet[tablet_id] += 1
        async with s.lock:
            return await self._page(s, batch_bytes)

    async def next(
        self, scanner_id: bytes, call_seq_id: int, batch_bytes: int
    ) -> tpb.ScanResponsePB:
        s = self.scanners.get(scanner_id)
        if s is None:
            raise NotFound(
                f"scanner {scanner_id.hex()} not found (expired after {self.ttl_s:g}s idle, "
                "finished, or the server restarted): resume with start_after_primary_key"
            )
        async with s.lock:
            s.last_used = time.monotonic()
            if call_seq_id == s.call_seq and s.last_page is not None:
                return s.last_page  # a retry of the last call
            if s.finished:
                raise NotFound(f"scanner {scanner_id.hex()} finished; its last page was sent")
            if call_seq_id != s.call_seq + 1:
                raise InvalidArgument(
                    f"scanner {scanner_id.hex()}: call_seq_id {call_seq_id}, expected "
                    f"{s.call_seq + 1} (or {s.call_seq} to repeat the last call)"
                )
            s.call_seq = call_seq_id
            return await self._page(s, batch_bytes)

    def close(self, scanner_id: bytes) -> None:
        self.scanners.pop(scanner_id, None)

    async def _page(self, s: Scanner, batch_bytes: int) -> tpb.ScanResponsePB:
        if batch_bytes <= 0:
            batch_bytes = DEFAULT_BATCH_BYTES
        batch_bytes = min(batch_bytes, MAX_BATCH_BYTES)
        batches, last_key, done = await asyncio.to_thread(_pull, s, batch_bytes)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, s.schema) as w:
            for b in batches:
                w.write_batch(b)
        resp = tpb.ScanResponsePB(
            batch=sink.getvalue().to_pybytes(),
            has_more_results=not done,
            last_primary_key=last_key,
            applied_index=s.applied_index,
            schema_version=s.schema_version,
        )
        # A finished scanner stays (until it expires) only to answer a retry of its last call.
        s.finished = done
        if not done:
            resp.scanner_id = s.id
        s.last_page = resp
        s.last_used = time.monotonic()
        self.pages_sent += 1
        self.bytes_sent += len(resp.batch)
        return resp


def _pull(s: Scanner, batch_bytes: int) -> tuple[list[pa.RecordBatch], bytes, bool]:
    """Up to `batch_bytes` of rows (at least one row), honouring the limit; batches larger
    than that are cut. Returns the projected batches, the encoded key of the last row and
    whether the scan is over. Runs in a worker thread (module docstring)."""
    out: list[pa.RecordBatch] = []
    size = 0
    last: pa.RecordBatch | None = None
    done = False
    while size < batch_bytes:
        if s.limit and s.rows_returned >= s.limit:
            done = True
            break
        if s.pending is not None:
            batch, s.pending = s.pending, None
        else:
            try:
                batch = next(s.it)
            except StopIteration:
                done = True
                break
        if batch.num_rows == 0:
            continue
        if s.limit and s.rows_returned + batch.num_rows > s.limit:
            batch = batch.slice(0, s.limit - s.rows_returned)
        room = batch_bytes - size
        if batch.nbytes > room:
            per_row = max(1, batch.nbytes // batch.num_rows)
            n = max(1 if not out else 0, room // per_row)
            if n == 0:
                s.pending = batch
                break
            if n < batch.num_rows:
                s.pending = batch.slice(n)
                batch = batch.slice(0, n)
        out.append(batch)
        size += batch.nbytes
        s.rows_returned += batch.num_rows
        last = batch
    last_key = b""
    if last is not None:
        last_key = encode_keys_arrow(s.key_cols, last.slice(last.num_rows - 1, 1))[0]
    names = s.schema.names
    return [b.select(names) for b in out], last_key, done
