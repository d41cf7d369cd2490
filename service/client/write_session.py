"""Write sessions: rows routed to their tablets' leaders in batches, per-row errors reported.

Theory of operation
-------------------
`apply()` buffers Arrow data with an operation (insert, upsert, update, delete,
insert_ignore); `flush()` sends what is buffered and returns a `WriteResult`. A flush:

1. computes every row's partition key (`PartitionSchema.partition_keys_for_arrow`, vectorized)
   and finds its tablet in the client's location cache (one bisect per row), fetching the
   table's locations from the master first if the cache is cold;
2. sends each tablet's rows to that tablet's leader, tablets in parallel (at most
   `max_tablets_in_flight`), one tablet's batches strictly in order: two operations on the same
   key within a session apply in the order they were given;
3. retries a tablet's batch inside the session timeout when the leader moved (NOT_THE_LEADER:
   straight to the hinted leader; ABORTED: the entry was overwritten by a new leader, so it was
   certainly not applied), the server is unreachable (ask the other replicas, a follower
   names the leader), or the tablet is gone from the server (NOT_FOUND: the tablet was replaced;
   drop the cache entry and route those rows again through the master).

Per-row failures (an INSERT of a key that exists, an UPDATE of a missing key) do not fail the
batch: the tablet server applies the other rows and reports the failed ones, which the session
maps back to the row's index in the data given to `apply()` and its key values.

Transactions. A session with a `txn_id` stages its rows in that transaction (invisible until
it commits, service/client/transactions.py); the tablet server refuses them with
FAILED_PRECONDITION once the transaction is not open, which is not retried. A write that meets
a row another transaction holds is ABORTED after the server's lock wait: a plain write retries
it like a leader change until the session's deadline (it waits for the transaction to end), a
transactional one raises it (its writer aborts and runs the transaction again: two
transactions that wait on each other would otherwise only wait out their deadlines).

Retries and duplicates. The tablet server has no per-client request ids yet, so a batch whose
reply was lost (a timeout, a leader killed after it committed) is at-least-once: a retried
INSERT may then report ALREADY_EXISTS for rows that the first attempt wrote, a retried DELETE
NOT_FOUND. UPSERT (the default of the Spark writer) is idempotent and unaffected. Acknowledged
writes are never lost: a batch counts as written only once a leader answered after committing
it.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pyarrow as pa

from service.client.channels import ChannelPool
from service.client.meta_cache import MetaCache, TableHandle, TabletLocation
from service.client.retry import Backoff, Deadline
from service.common.errors import (
    Aborted,
    InvalidArgument,
    InvalidAuthzToken,
    NotFound,
    NotTheLeader,
    ServiceUnavailable,
    TesseraError,
    Timeout,
    WrongDestination,
)
from service.pb import tserver_pb2 as tpb

__all__ = ["OPERATIONS", "RequestIds", "RowError", "SessionClient", "WriteResult", "WriteSession"]

log = logging.getLogger(__name__)

OPERATIONS: dict[str, int] = {
    "insert": tpb.ROW_OP_INSERT,
    "upsert": tpb.ROW_OP_UPSERT,
    "update": tpb.ROW_OP_UPDATE,
    "delete": tpb.ROW_OP_DELETE,
    "insert_ignore": tpb.ROW_OP_INSERT_IGNORE,
}

MAX_BATCH_ROWS = 50_000
MAX_BATCH_BYTES = 8 << 20
"""Rows, and bytes of Arrow IPC, per Write RPC at most: big enough to amortize a Raft round,
and the most a tablet server accepts in one Write (MAX_WRITE_ROWS and MAX_WRITE_BYTES in
service/tserver/row_ops.py: each step of a write must stay short on its event loop)."""


@dataclass(frozen=True)
class RowError:
    """One refused row: its index in the applied data, its key values, why."""

    row_index: int
    key: tuple[object, ...]
    code: str
    message: str

    def __str__(self) -> str:
        return f"row {self.row_index} key {self.key!r}: {self.code}: {self.message}"


@dataclass
class WriteResult:
    rows_applied: int = 0
    errors: list[RowError] = field(default_factory=list)
    batches_sent: int = 0
    retries: int = 0
    commit_timestamp: int = 0
    """The newest hybrid time any of its batches committed at: a snapshot read at or after it
    sees every row this write applied (docs/design/tablets.md#R3)."""

    def merge(self, other: WriteResult) -> None:
        self.rows_applied += other.rows_applied
        self.errors.extend(other.errors)
        self.batches_sent += other.batches_sent
        self.retries += other.retries
        self.commit_timestamp = max(self.commit_timestamp, other.commit_timestamp)


CLIENT_ID_BYTES = 16
"""The length of a client id (the tablet server refuses others)."""


class RequestIds:
    """Names for one client's write requests (docs/design/tablets.md#R6): a random client id
    and sequence numbers from 1. A batch keeps its name across retries, so the tablet applies
    it once and answers a retry with the first attempt's outcome; the lowest number still
    awaited tells servers which outcomes they may forget."""

    def __init__(self) -> None:
        self.client_id = os.urandom(CLIENT_ID_BYTES)
        self._next = 1
        self._open: set[int] = set()

    @contextmanager
    def request(self, *, named: bool) -> Iterator[int]:
        """A new request's number while it is awaited (0, and no number used, when `named` is
        false)."""
        if not named:
            yield 0
            return
        seq = self._next
        self._next += 1
        self._open.add(seq)
        try:
            yield seq
        finally:
            self._open.discard(seq)

    def pb(self, seq: int) -> tpb.WriteRequestIdPB:
        return tpb.WriteRequestIdPB(
            client_id=self.client_id,
            seq_no=seq,
            first_incomplete_seq_no=min(self._open, default=seq),
        )


class SessionClient(Protocol):
    """What a write session uses of its client (a `TesseraClient`, which makes sessions): the
    location cache and channels it routes and sends with, the names of its write requests, and
    the client's read-your-writes state, which every acknowledged batch advances. Named here,
    rather than the client imported, so that this module does not depend on the client that
    imports it."""

    @property
    def meta(self) -> MetaCache: ...

    @property
    def channels(self) -> ChannelPool: ...

    @property
    def request_ids(self) -> RequestIds: ...

    @property
    def latest_timestamp(self) -> int:
        """The newest hybrid timestamp the client has seen (sent with every batch)."""
        ...

    def note_applied(self, tablet_id: str, index: int) -> None:
        """A batch was applied at `index` of the tablet: later scans of it wait for that."""
        ...

    def observe_timestamp(self, ts: int) -> None:
        """A server returned hybrid timestamp `ts` (a batch's commit)."""
        ...


@dataclass
class _Pending:
    data: pa.Table
    op: int
    first_index: int  # index of data's first row among every row applied to the session


class WriteSession:
    """Buffers writes to one table and sends them per tablet leader (module docstring)."""

    def __init__(
        self,
        client: SessionClient,
        table: TableHandle,
        *,
        timeout: float = 60.0,
        max_buffered_rows: int = 200_000,
        max_tablets_in_flight: int = 8,
        batch_rows: int = MAX_BATCH_ROWS,
        txn_id: int = 0,
        txn_attempt: str = "",
    ) -> None:
        self.client = client
        self.txn_id = txn_id
        """Stage every write in this transaction (docs/design/transactions.md#R2); 0: plain."""
        self.txn_attempt = txn_attempt
        """The writer's attempt id within the transaction (a Spark task attempt)."""
        self.table = table
        self.timeout = timeout
        self.max_buffered_rows = max_buffered_rows
        self.batch_rows = batch_rows
        self._sem = asyncio.Semaphore(max_tablets_in_flight)
        self._pending: list[_Pending] = []
        self._buffered = 0
        self._applied_rows = 0
        self.result = WriteResult()
        """Everything flushed so far."""

    async def apply(self, data: pa.Table | pa.RecordBatch, op: str = "upsert") -> None:
        """Buffer `data` (columns by name) with operation `op`; flushes past the buffer limit."""
        code = OPERATIONS.get(op)
        if code is None:
            raise InvalidArgument(f"operation: expected one of {', '.join(OPERATIONS)}, got {op!r}")
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        try:
            # Routing slices the rows by tablet: on an array whose offsets or lengths lie, that
            # reads wild memory here, before the server's own check could refuse it.
            table.validate(full=True)
        except (pa.ArrowException, ValueError) as e:
            raise InvalidArgument(f"table {self.table.name!r}: invalid Arrow data: {e}") from None
        missing = [
            c.name for c in self.table.schema.key_columns if c.name not in table.schema.names
        ]
        if missing:
            raise InvalidArgument(
                f"table {self.table.name!r}: the data has no key column {missing[0]!r}"
            )
        self._pending.append(_Pending(table, code, self._applied_rows))
        self._applied_rows += table.num_rows
        self._buffered += table.num_rows
        if self._buffered >= self.max_buffered_rows:
            await self.flush()

    async def flush(self) -> WriteResult:
        """Send everything buffered; the result of this flush (also added to `self.result`)."""
        pending, self._pending, self._buffered = self._pending, [], 0
        out = WriteResult()
        deadline = Deadline.after(self.timeout)
        for p in pending:
            out.merge(await self._write(p, deadline))
        self.result.merge(out)
        return out

    # --- one apply() worth of rows ------------------------------------------------------------

    async def _route(
        self, data: pa.Table, rows: np.ndarray, deadline: Deadline
    ) -> dict[str, tuple[TabletLocation, np.ndarray]]:
        """Row indices (into `data`) grouped by tablet."""
        info = self.table
        meta = self.client.meta
        sub = data.take(pa.array(rows)) if len(rows) != data.num_rows else data
        keys = info.partition_schema.partition_keys_for_arrow(info.schema, sub)
        if not meta.cached(info.table_id):
            await meta.tablets(info.table_id, deadline.attempt_timeout())
        groups: dict[str, list[int]] = defaultdict(list)
        locs: dict[str, TabletLocation] = {}
        last: TabletLocation | None = None
        for j, k in enumerate(keys):
            if last is None or not last.partition.contains(k):
                last = await meta.lookup(info.table_id, k, deadline.attempt_timeout())
                locs[last.tablet_id] = last
            groups[last.tablet_id].append(int(rows[j]))
        return {t: (locs[t], np.asarray(ix, dtype=np.int64)) for t, ix in groups.items()}

    async def _write(self, p: _Pending, deadline: Deadline) -> WriteResult:
        result = WriteResult()
        todo = np.arange(p.data.num_rows, dtype=np.int64)
        rounds = 0
        while len(todo):
            rounds += 1
            groups = await self._route(p.data, todo, deadline)
            outcomes = await asyncio.gather(
                *(self._write_tablet(p, loc, rows, deadline) for loc, rows in groups.values())
            )
            again: list[np.ndarray] = []
            for r, leftover in outcomes:
                result.merge(r)
                if leftover is not None and len(leftover):
                    again.append(leftover)
            todo = np.concatenate(again) if again else np.empty(0, dtype=np.int64)
            if len(todo):
                result.retries += 1
                await Backoff(initial=0.05 * rounds).sleep(deadline)
        return result

    async def _write_tablet(
        self, p: _Pending, loc: TabletLocation, rows: np.ndarray, deadline: Deadline
    ) -> tuple[WriteResult, np.ndarray | None]:
        """Write `rows` of `p` to `loc`'s leader in order; rows left to re-route on NOT_FOUND."""
        result = WriteResult()
        async with self._sem:
            sent = 0
            for chunk, payload in self._batches(p.data, rows):
                try:
                    resp, loc = await self._send(p, loc, payload, deadline, result)
                except NotFound:
                    # The tablet left this server for good (deleted, replaced after an
                    # assignment timeout): forget it and route what is left again.
                    self.client.meta.invalidate(loc.table_id, loc.tablet_id)
                    return result, rows[sent:]
                sent += len(chunk)
                result.rows_applied += resp.rows_applied
                result.batches_sent += 1
                for e in resp.per_row_errors:
                    idx = int(chunk[e.row_index])
                    result.errors.append(
                        RowError(
                            p.first_index + idx,
                            self._key(p.data, idx),
                            e.error.code,
                            e.error.message,
                        )
                    )
                self.client.note_applied(loc.tablet_id, resp.applied_index)
                self.client.observe_timestamp(resp.commit_timestamp)
                result.commit_timestamp = max(result.commit_timestamp, resp.commit_timestamp)
        return result, None

    def _batches(self, data: pa.Table, rows: np.ndarray) -> Iterator[tuple[np.ndarray, bytes]]:
        """`rows` of `data`, in order, as consecutive chunks with their Arrow IPC payloads, each
        of at most `batch_rows` rows and MAX_BATCH_BYTES bytes (a chunk of rows wider than the
        average is halved until it fits; a single row that does not is sent for the server
        to refuse, naming the limit)."""
        per_row = max(1, data.nbytes // max(1, data.num_rows))
        step = max(1, min(self.batch_rows, MAX_BATCH_BYTES // per_row))
        todo = [rows[i : i + step] for i in reversed(range(0, len(rows), step))]
        while todo:
            chunk = todo.pop()
            payload = _ipc(data.take(pa.array(chunk)))
            if len(payload) > MAX_BATCH_BYTES and len(chunk) > 1:
                half = len(chunk) // 2
                todo += [chunk[half:], chunk[:half]]
                continue
            yield chunk, payload

    def _key(self, data: pa.Table, idx: int) -> tuple[object, ...]:
        row = data.slice(idx, 1).to_pylist()[0]
        return tuple(row.get(c.name) for c in self.table.schema.key_columns)

    async def _send(
        self,
        p: _Pending,
        loc: TabletLocation,
        payload: bytes,
        deadline: Deadline,
        result: WriteResult,
    ) -> tuple[tpb.WriteResponsePB, TabletLocation]:
        """One batch (rows as Arrow IPC) to the tablet's leader, following leadership changes
        until the deadline."""
        # One name for every attempt of this batch (docs/design/tablets.md#R6); none for a
        # transaction's writes: its commit decides what is written.
        with self.client.request_ids.request(named=not self.txn_id) as seq:
            backoff = Backoff()
            tried: set[str] = set()
            refreshed = False
            last: TesseraError | None = None
            while True:
                target = loc.leader()
                if target is None or target.ts_uuid in tried:
                    target = next((r for r in loc.replicas if r.ts_uuid not in tried), None)
                if target is None:
                    # Every replica failed this round: ask the master again, after a pause.
                    tried.clear()
                    try:
                        await backoff.sleep(deadline)
                    except Timeout:
                        raise Timeout(
                            f"write to tablet {loc.tablet_id} of {self.table.name!r} timed out; "
                            f"last error: {last}"
                        ) from last
                    self.client.meta.invalidate(loc.table_id, loc.tablet_id)
                    loc = await self.client.meta.lookup(
                        loc.table_id, loc.start, deadline.attempt_timeout()
                    )
                    continue
                req = tpb.WriteRequestPB(
                    dest_uuid=target.ts_uuid,
                    tablet_id=loc.tablet_id,
                    rows=payload,
                    default_op=tpb.RowOperationTypePB.ValueType(p.op),
                    schema_version=self.table.schema.version,
                    authz_token=self.client.meta.authz_token(loc.table_id),
                    propagated_timestamp=self.client.latest_timestamp,
                    txn_id=self.txn_id,
                    txn_attempt=self.txn_attempt,
                    request_id=self.client.request_ids.pb(seq) if seq else None,
                )
                stub = self.client.channels.tserver(target.address)
                try:
                    attempt_s = deadline.attempt_timeout(30.0)  # Timeout once the deadline passed
                except Timeout:
                    if last is None:
                        raise
                    raise Timeout(
                        f"write to tablet {loc.tablet_id} of {self.table.name!r} timed out; "
                        f"last error: {last}"
                    ) from last
                try:
                    resp: tpb.WriteResponsePB = await stub.Write(req, timeout=attempt_s)  # type: ignore[misc]
                    return resp, loc
                except TesseraError as e:  # the call failed (service/common/error_mapping.py)
                    err = e
                # An attempt cut short by the deadline says less than the one before it (a row
                # locked by a transaction, say).
                last = last if isinstance(err, Timeout) and last is not None else err
                result.retries += 1
                tried.add(target.ts_uuid)
                if isinstance(err, Aborted) and self.txn_id:
                    # A row another transaction holds (after the server's lock wait), or a staged
                    # entry a new leader overwrote: either way the transaction's writer decides
                    # (abort and run it again), as two transactions that wait on each other would
                    # only wait out their deadlines.
                    raise err
                if isinstance(err, InvalidAuthzToken) and not refreshed:
                    refreshed = True  # expired or outdated: one fresh token, then the same target
                    await self.client.meta.refresh_authz_token(
                        loc.table_id, deadline.attempt_timeout()
                    )
                    tried.discard(target.ts_uuid)
                    continue
                if isinstance(err, NotTheLeader):
                    if err.leader_uuid and loc.replica(err.leader_uuid) is not None:
                        loc = self.client.meta.note_leader(loc, err.leader_uuid)
                        tried.discard(err.leader_uuid)
                        if err.leader_uuid != target.ts_uuid:
                            continue
                elif not isinstance(err, ServiceUnavailable | Timeout | WrongDestination | Aborted):
                    raise err
                log.debug("write to %s on %s: %s; retrying", loc.tablet_id, target.ts_uuid, err)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def format_errors(errors: Sequence[RowError], limit: int = 5) -> str:
    """A short summary of per-row errors for messages ("3 rows failed: ...")."""
    if not errors:
        return "no row errors"
    head = "; ".join(str(e) for e in errors[:limit])
    more = f" (and {len(errors) - limit} more)" if len(errors) > limit else ""
    return f"{len(errors)} rows failed: {head}{more}"
