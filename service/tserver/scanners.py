"""Scanners: paged scans of one tablet, each named by a scanner id and expired when idle.

Theory of operation
-------------------
`Scan` opens a scanner over a consistent snapshot of the tablet (`RowStore.scan_with_keys`
reads the state at the moment it is called) and returns the first page; `ScanNext` returns the
following ones; the last page carries `has_more_results = false` and the scanner is gone.
A page is an Arrow IPC stream of whole record batches, cut at `batch_size_bytes` (at least one
row, so a huge row still makes progress); a page may be smaller than asked.

Pages are built off the event loop and sent as they were built. Pulling batches from the
row store, writing the IPC stream and serializing the response all run in a worker thread
(`_build`): decoding and filtering files must not stall the event loop that runs Raft for every
tablet on the server. The response is serialized there too, once (`ScanPage.wire`): the page's
size is worked out in advance (the IPC stream written to a `pa.MockOutputStream`, which only
counts), the response's small fields and the `batch` field's tag and length are framed by
hand, and Arrow writes the IPC stream straight into the `bytes` object gRPC will send
(`_new_bytes`). So the megabytes of a page are copied once on their way out of Python (rows ->
response bytes), by Arrow with the GIL released, where they were copied five times through
`to_pybytes`, the message and `SerializeToString`, and then twice through an IPC buffer and a
`b"".join` that held the GIL (a sixth of the server's GIL time in a profile of back-to-back
scans, while the event loop waited to hand gRPC the page before). `add_data_servicer`
registers Scan and ScanNext with a serializer that sends `ScanPage.wire` as it is; the client
sees an ordinary ScanResponsePB (and reads its rows in place: service/client/scan_reply.py).

Read-ahead: once a page is sent and the scan is not over, the next page (of the same size)
is built in the background, so the server's work overlaps the transfer and the client's
decoding of the page before; ScanNext then answers with the page already built. That holds at
most one extra page in memory per open scanner. If the client asks for smaller pages than
the one built ahead, its batches are put back and cut again.

Retries: every ScanNext names its `call_seq_id` (1, 2, ...). A retry of the last call (same
number: the client did not get the answer) is answered with the same page again, kept for that
purpose; any other number is refused, since pages cannot be re-read once the iterator moved on.
A call cancelled while its page was being built leaves the page for its retry. Each page
carries the encoded key of its last row, so a client that lost the scanner (expired, or the
server died) resumes on any replica with `start_after_primary_key`.

Idle scanners expire after `ttl_s` (a sweep every ttl/4), so a client that vanished does not
pin a snapshot forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from service.common.errors import InvalidArgument, NotFound
from service.common.keys import encode_keys_arrow
from service.common.registration import register
from service.common.schema import ColumnSchema
from service.pb import tserver_pb2 as tpb
from service.pb import tserver_pb2_grpc as tpb_grpc

log = logging.getLogger(__name__)

DEFAULT_BATCH_BYTES = 2 << 20
"""Below gRPC's default 4 MB message limit, so a client with default channel options can scan."""
MAX_BATCH_BYTES = 64 << 20

_BATCH_TAG = bytes([(2 << 3) | 2])
"""ScanResponsePB.batch: field 2, wire type 2 (length-delimited)."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclass(frozen=True)
class ScanPage:
    """One page as it goes on the wire: a serialized ScanResponsePB (see the module docstring).

    `wire` is the message; the other fields repeat what the scanner needs to know about it
    without parsing it back.
    """

    wire: bytes
    batch_bytes: int
    """Size of the Arrow IPC stream in `wire` (the `batch` field)."""
    has_more_results: bool
    rows: int

    def to_pb(self) -> tpb.ScanResponsePB:
        """The page as a message (tests, in-process callers)."""
        return tpb.ScanResponsePB.FromString(self.wire)


def serialize_scan_response(resp: ScanPage | tpb.ScanResponsePB) -> bytes:
    """gRPC response serializer of Scan and ScanNext: a `ScanPage` is already serialized."""
    if isinstance(resp, ScanPage):
        return resp.wire
    return resp.SerializeToString()


def add_data_servicer(servicer: tpb_grpc.TabletServerServiceServicer, server: Any) -> None:
    """Register the data service on `server` as the generated code does, except that Scan and
    ScanNext may answer with a pre-serialized `ScanPage` (`serialize_scan_response`)."""
    register(
        tpb_grpc.add_TabletServerServiceServicer_to_server,
        servicer,
        server,
        response_serializers=dict.fromkeys(("Scan", "ScanNext"), serialize_scan_response),
    )


@dataclass
class _Built:
    """A page built by `_build`, not yet sent: its batches stay until it is, in case the client
    asks for smaller pages and they must be cut again."""

    page: ScanPage
    batches: list[pa.RecordBatch]
    size: int
    """Arrow bytes of `batches` (what the page size is compared with)."""


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
    last_page: ScanPage | None = None
    rows_returned: int = 0
    """Rows in pages sent."""
    rows_pulled: int = 0
    """Rows taken from `it` into built pages (sent or built ahead); the limit counts these."""
    pending: list[pa.RecordBatch] = field(default_factory=list)
    """Batches taken from `it` but in no page yet, oldest first."""
    exhausted: bool = False
    finished: bool = False
    ahead: asyncio.Future[_Built] | None = None
    """The next page, being built in a worker thread (read-ahead)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    owner: str = ""
    """Who opened it (their identity); only they may continue or close it."""
    snapshot_timestamp: int = 0
    """READ_AT_SNAPSHOT: the hybrid timestamp it reads at (every page says so)."""


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
        for s in self.scanners.values():
            _drop_ahead(s)
        self.scanners.clear()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.ttl_s / 4))
            now = time.monotonic()
            for sid, s in list(self.scanners.items()):
                if now - s.last_used > self.ttl_s and not s.lock.locked():
                    del self.scanners[sid]
                    _drop_ahead(s)
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
        owner: str = "",
        snapshot_timestamp: int = 0,
    ) -> ScanPage:
        """Open a scanner and build its first page. `owner` (the caller's identity) is the
        only caller that may continue or close it."""
        s = Scanner(
            os.urandom(16),
            tablet_id,
            schema,
            it,
            key_cols,
            applied_index,
            schema_version,
            limit,
            owner=owner,
            snapshot_timestamp=snapshot_timestamp,
        )
        self.opened += 1
        self.opened_by_tablet[tablet_id] += 1
        async with s.lock:
            # Listed only once its first page exists: a failed or cancelled open leaves nothing.
            limit = _clamp(batch_bytes)
            built = await asyncio.to_thread(_build, s, limit)
            if built.page.has_more_results:
                self.scanners[s.id] = s
            return self._sent(s, built, limit)

    async def next(
        self, scanner_id: bytes, call_seq_id: int, batch_bytes: int, owner: str = ""
    ) -> ScanPage:
        s = self.scanners.get(scanner_id)
        if s is None or s.owner != owner:  # another caller's scanner looks like no scanner
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
            limit = _clamp(batch_bytes)
            fut, s.ahead = s.ahead, None
            if fut is None:
                fut = _start_build(s, limit)
            try:
                built = await asyncio.shield(fut)
                if built.size > limit and built.page.rows > 1:
                    # Built ahead for larger pages than this call asks: cut its rows again.
                    s.pending[:0] = built.batches
                    s.rows_pulled -= built.page.rows
                    fut = _start_build(s, limit)
                    built = await asyncio.shield(fut)
            except asyncio.CancelledError:
                if not fut.cancelled():
                    s.ahead = fut  # the page waits for the retry of this call
                raise
            s.call_seq = call_seq_id
            return self._sent(s, built, limit)

    def close(self, scanner_id: bytes, owner: str = "") -> None:
        s = self.scanners.get(scanner_id)
        if s is not None and s.owner == owner:
            del self.scanners[scanner_id]
            _drop_ahead(s)

    def _sent(self, s: Scanner, built: _Built, limit: int) -> ScanPage:
        """Book `built` as sent; if the scan goes on, start building the next page, of the
        size this call asked for (a client that changes its page size changes it from here)."""
        page = built.page
        s.rows_returned += page.rows
        s.last_page = page
        s.last_used = time.monotonic()
        # A finished scanner stays (until it expires) only to answer a retry of its last call.
        s.finished = not page.has_more_results
        if not s.finished and self.scanners.get(s.id) is s:  # not closed meanwhile
            s.ahead = _start_build(s, limit)
        self.pages_sent += 1
        self.bytes_sent += page.batch_bytes
        return page


def _clamp(batch_bytes: int) -> int:
    if batch_bytes <= 0:
        return DEFAULT_BATCH_BYTES
    return min(batch_bytes, MAX_BATCH_BYTES)


def _start_build(s: Scanner, limit: int) -> asyncio.Future[_Built]:
    fut = asyncio.get_running_loop().run_in_executor(None, _build, s, limit)
    # Retrieve the outcome even if no call ever awaits it (the scanner expired or was closed).
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    return fut


def _drop_ahead(s: Scanner) -> None:
    if s.ahead is not None:
        s.ahead.cancel()  # a build already running finishes in its thread; its page is dropped
        s.ahead = None


def _build(s: Scanner, limit: int) -> _Built:
    """The next page of `s`: up to `limit` bytes of rows (at least one row), honouring the row
    limit; batches larger than that are cut. Runs in a worker thread, one at a time per
    scanner (module docstring)."""
    out: list[pa.RecordBatch] = []
    size = 0
    while size < limit:
        batch = _next_batch(s)
        if batch is None:
            break
        room = limit - size
        if batch.nbytes > room:
            per_row = max(1, batch.nbytes // batch.num_rows)
            n = max(1 if not out else 0, room // per_row)
            if n == 0:
                s.pending.insert(0, batch)
                break
            if n < batch.num_rows:
                s.pending.insert(0, batch.slice(n))
                batch = batch.slice(0, n)
        out.append(batch)
        size += batch.nbytes
        s.rows_pulled += batch.num_rows
    if not s.pending and not s.exhausted:
        # Look one batch ahead so that the page holding the last rows says so, sparing the
        # client a round trip for an empty last page.
        peek = _next_batch(s)
        if peek is not None:
            s.pending.append(peek)
    done = not s.pending and s.exhausted
    rows = sum(b.num_rows for b in out)
    last_key = b""
    if out:
        last = out[-1]
        last_key = encode_keys_arrow(s.key_cols, last.slice(last.num_rows - 1, 1))[0]
    names = s.schema.names
    batches = [b.select(names) for b in out]
    ipc_size = _ipc_size(s.schema, batches)
    head = tpb.ScanResponsePB(
        scanner_id=b"" if done else s.id,
        has_more_results=not done,
        last_primary_key=last_key,
        applied_index=s.applied_index,
        schema_version=s.schema_version,
        snapshot_timestamp=s.snapshot_timestamp,
    ).SerializeToString()
    prefix = b"".join((head, _BATCH_TAG, _varint(ipc_size)))
    wire, sink = _new_bytes(len(prefix) + ipc_size)
    sink.write(prefix)
    _write_ipc(sink, s.schema, batches)
    if sink.tell() != len(wire):
        raise AssertionError(f"scan page: wrote {sink.tell()} bytes of {len(wire)}")
    return _Built(ScanPage(wire, ipc_size, not done, rows), out, size)


def _next_batch(s: Scanner) -> pa.RecordBatch | None:
    """The next non-empty batch of `s` (pending ones first) within its row limit; None at the
    end (and `s.exhausted` set)."""
    while True:
        if s.limit and s.rows_pulled >= s.limit:
            s.exhausted = True
            s.pending.clear()
            return None
        if s.pending:
            batch = s.pending.pop(0)
        elif s.exhausted:
            return None
        else:
            try:
                batch = next(s.it)
            except StopIteration:
                s.exhausted = True
                return None
        if batch.num_rows == 0:
            continue
        if s.limit and s.rows_pulled + batch.num_rows > s.limit:
            batch = batch.slice(0, s.limit - s.rows_pulled)
        return batch


def _ipc_size(schema: pa.Schema, batches: list[pa.RecordBatch]) -> int:
    """Bytes of `batches` as one Arrow IPC stream (written to a counter, not to memory)."""
    mock = pa.MockOutputStream()
    _write_ipc(mock, schema, batches)
    return int(mock.size())


def _write_ipc(sink: Any, schema: pa.Schema, batches: list[pa.RecordBatch]) -> None:
    with pa.ipc.new_stream(sink, schema) as w:
        for b in batches:
            w.write_batch(b)


_PyBytes_FromStringAndSize = ctypes.pythonapi.PyBytes_FromStringAndSize
_PyBytes_FromStringAndSize.restype = ctypes.py_object
_PyBytes_FromStringAndSize.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_BYTES_DATA_OFFSET = bytes.__basicsize__ - 1
"""Where a CPython `bytes` object's contents start (`ob_sval`; the 1 is its trailing NUL)."""


def _new_bytes(size: int) -> tuple[bytes, pa.FixedSizeBufferWriter]:
    """A new `bytes` object of `size` bytes and a writer over its contents, to be filled
    before the object is shared (module docstring: a page is copied once, not twice).

    This is what C code does with `PyBytes_FromStringAndSize(NULL, size)`: the object is
    fresh, referenced only here, never hashed, so writing its storage before it is returned
    breaks no one's assumption that bytes do not change. gRPC sends only `bytes`, so this is
    the one way to build a page where it goes without a last copy of it (under the GIL) by
    `b"".join`. The writer must not be used once the object is returned."""
    if size < 2:  # CPython may hand out shared objects for sizes 0 and 1
        raise ValueError(f"a page of {size} bytes")
    out = _PyBytes_FromStringAndSize(None, size)
    storage = (ctypes.c_char * size).from_address(id(out) + _BYTES_DATA_OFFSET)
    return out, pa.FixedSizeBufferWriter(pa.py_buffer(storage))
