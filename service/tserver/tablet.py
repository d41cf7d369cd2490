"""One tablet replica: its Raft group, its rows, and the state machine between them.

Theory of operation
-------------------
A replica is a `RaftNode` (group id = tablet id) whose state machine is the tablet's `RowStore`.
Every change to rows or schema is a Raft entry; the first byte says which:

  b"V" + ts + WriteBatch.encode()
                               a batch of row operations, validated by the leader BEFORE it is
                               proposed (bad input never reaches the log), with its commit
                               timestamp `ts` (8 bytes, big-endian hybrid time) assigned by the
                               leader as it proposes; per-row outcomes (duplicate key, missing
                               key) are decided at apply, identically on every replica, and
                               every replica keeps the rows as versions committed at `ts`
  b"S" + ts                    a timestamp entry: nothing commits at or before `ts` after it
                               (a quiet tablet's safe time moves on, docs/design/tablets.md#R4)
  b"W" + WriteBatch.encode()   a write from before timestamps: applied as committed at 0
  b"A" + AlterSchemaRequestPB  a new schema (and table name), applied in log order, so a write
                               proposed under the old schema is applied under the schema that
                               precedes it in the log
  b"B", b"T", b"P", b"C", b"X" a transaction's begin here, staged write, prepare (stamped
                               like a timestamp entry), commit (at its commit timestamp) and
                               abort (txn_staging.py, docs/design/transactions.md#R2, #R3)

Durability and replay: the WAL makes an acknowledged write durable (the write is acknowledged
only once applied on the leader, i.e. committed on a majority). The RowStore flushes its
in-memory rows to columnar files in the background; `flushed_index` says which entries the
files already hold, and the replay after a restart skips them (`RowStore.apply_write` ignores
indexes at or below what it has). A Raft snapshot (for a follower that fell behind the log the
leader kept) is never sent: the tablet's snapshots are *anchors* (consensus/snapshots.py), taken
at the row store's flushed index once it moves on, with no rows in them. So the log is kept
exactly from what the files do not yet hold (Kudu's WAL anchored by the flushed index), taking
one costs a small file write, and a follower behind the leader's log is given the files by a
tablet copy (tablet_copy.py). At start, the anchor is checked against the files.

Flushing: after an apply, when the in-memory store passes `flush_rows` or `flush_bytes`, one
background task freezes it (on the loop, cheap), writes and fsyncs the file in a worker thread
while applies continue, and installs it: the new manifest is staged on the loop, written and
fsynced in a worker thread, and the file takes the frozen memstore's place on the loop once it
is durable (rowstore.py, Installs). Compaction follows the same pattern when
there are more than `compact_files` files. A tablet that takes no write for `flush_idle_s` is
flushed anyway, and then each group of files whose key ranges overlap is compacted into one:
a cold tablet ends as files a scan reads straight through, with no merge (one timer per
tablet, armed by the first write after the last idle flush).

State (`state`): NOT_STARTED -> BOOTSTRAPPING -> RUNNING; FAILED if opening or the Raft loop
failed (the replica stays offline and is reported with its error); STOPPED after close.

Applying never takes the server down. An entry already in a log may not apply: written by an
older version that validated less, or by a bug. Such an entry fails this one replica, FAILED
(Kudu's tablet FAILED), while the server's other replicas carry on: whatever an apply raises
is caught by the state machine (`TabletStateMachine.apply`), which marks the row store failed
(nothing more reaches its files, rowstore.py) and the replica FAILED with the entry's index
and the cause, then lets the Raft loop stop. The loop's node is closed, so it takes no more
messages; the replica reports no role and no consensus state from then on (both are frozen at
the failure). The master treats a FAILED replica as lost and replaces it (3-4-3, see
master/rereplication.py), then tombstones it. A restart replays the same entry and fails the
same way: a FAILED replica, never a crash loop. A write entry is decoded with full Arrow
validation before anything reads its buffers (`WriteBatch.decode`), so bytes that would make
native code read wild memory fail here as Corruption instead of taking the process down.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import shutil
import struct
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError

from service.common import failpoints
from service.common.config import TServerConfig
from service.common.errors import (
    Aborted,
    ClockError,
    Corruption,
    FailedPrecondition,
    InvalidArgument,
    IOFatal,
    NotTheLeader,
    OutsidePartition,
    PermissionDenied,
    ResourceExhausted,
    ServiceUnavailable,
    SnapshotTooOld,
    TabletNotRunning,
    TesseraError,
    Timeout,
)
from service.common.hybrid_time import HybridClock, describe, from_micros, physical_us
from service.common.keys import encode_keys_arrow
from service.common.partition import Partition, PartitionSchema
from service.common.predicates import ScanSpec
from service.common.schema import Schema
from service.common.schema_codec import (
    partition_from_pb,
    partition_schema_from_pb,
    schema_from_pb,
    schema_to_pb,
)
from service.consensus.fs import RealFileSystem
from service.consensus.node import LeaderChange, NodeSettings, RaftNode, Sender
from service.consensus.raft_store import RaftStore
from service.pb import common_pb2 as cpb
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.raft import ConfigChangeType, NodeId, RaftConfig, Role
from service.tserver import superblock as sbmod
from service.tserver import txn_staging as txns
from service.tserver.request_tracker import Outcome, RequestId, RequestTracker
from service.tserver.row_ops import WriteBatch, check_write_size, decode_write
from service.tserver.rowstore import AppliedWrite, RowStore
from service.tserver.rowstore_memstore import key_text
from service.tserver.superblock import DataState, Superblock
from service.tserver.txn_staging import RowLocks, TabletTxns, TxnRefusal

log = logging.getLogger(__name__)

_WRITE = b"W"
_WRITE_AT = b"V"
_WRITE_REQ = b"R"
_TIMESTAMP = b"S"
_ALTER = b"A"
_SNAP_INDEX = struct.Struct("<Q")
_TS = struct.Struct(">Q")


def write_entry(batch: WriteBatch) -> bytes:
    """The body of a validated write's Raft entry; `stamped` adds the kind and timestamp."""
    return _WRITE + batch.encode()


def stamped(entry: bytes, ts: int) -> bytes:
    """`write_entry`'s bytes as the entry that commits them at `ts` (module docstring)."""
    return _WRITE_AT + _TS.pack(ts) + entry[1:]


def named(entry: bytes, ts: int, rid: RequestId) -> bytes:
    """`stamped`, carrying the client's name for the request (request_tracker.py): every
    replica records the outcome under it when it applies the entry."""
    return _WRITE_REQ + _TS.pack(ts) + rid.encode() + entry[1:]


def timestamp_entry(ts: int) -> bytes:
    return _TIMESTAMP + _TS.pack(ts)


@dataclass(frozen=True)
class Placement:
    """Where a tablet lies in its table: its partition, and the table's partition schema
    bound to one schema version's column names (renames follow column ids)."""

    schema_version: int
    partition_schema: PartitionSchema
    partition: Partition


@dataclass(frozen=True)
class ValidatedWrite:
    """A client write checked under the schema and the tablet's partition (`validate_write`).

    `entry` is the Raft entry of the rows that may be applied (None: no such row); `kept` maps
    each of its rows to the request's row index (None: every row, in order); `refused` holds
    the per-row errors decided before replication (rows outside the partition)."""

    entry: bytes | None
    kept: np.ndarray | None = None
    refused: tuple[tuple[int, TesseraError], ...] = ()
    batch: WriteBatch | None = None
    """The rows of `entry` (their keys are what a transaction locks)."""

    def request_row(self, entry_row: int) -> int:
        return entry_row if self.kept is None else int(self.kept[entry_row])


def validate_write(
    schema: Schema, placement: Placement | None, rows: bytes, default_op: int, ops: list[int]
) -> ValidatedWrite:
    """A client write checked under `schema` (InvalidArgument if it is bad, or larger than a
    Write may be) and then row by row against the tablet's partition: a row whose key belongs
    to another tablet is refused with `OutsidePartition` naming its key and this tablet's
    partition, and the other rows go on (docs/design/tablets.md#R2). Applied here, such
    a row would sit beside the same key in its own tablet: a table with duplicate primary
    keys, and answers that depend on which tablet a query reads. Pure: runs in a thread."""
    check_write_size(len(rows))
    batch = decode_write(schema, rows, default_op, ops)
    check_write_size(len(rows), batch.num_rows)
    if placement is None or batch.num_rows == 0:
        if not batch.num_rows:
            return ValidatedWrite(None)
        return ValidatedWrite(write_entry(batch), batch=batch)
    outside = placement.partition_schema.rows_outside(schema, placement.partition, batch.table)
    if not outside.any():
        return ValidatedWrite(write_entry(batch), batch=batch)
    bad = np.flatnonzero(outside)
    where = placement.partition_schema.describe_partition(schema, placement.partition)
    keys = batch.table.select(list(schema.key)).take(pa.array(bad)).to_pylist()
    refused = tuple(
        (
            int(i),
            OutsidePartition(
                f"row {int(i)} key ({', '.join(f'{k}={v!r}' for k, v in key.items())}) "
                f"belongs to another tablet: it is outside this tablet's partition ({where})"
            ),
        )
        for i, key in zip(bad, keys, strict=True)
    )
    kept = np.flatnonzero(~outside)
    if kept.size == 0:
        return ValidatedWrite(None, kept, refused)
    inside = WriteBatch(
        batch.table.take(pa.array(kept)), batch.ops[kept], batch.schema_version, batch.column_ids
    )
    return ValidatedWrite(write_entry(inside), kept, refused, inside)


class ReplicaState(enum.Enum):
    """Values match master.proto's ReplicaStatePB."""

    NOT_STARTED = 1
    BOOTSTRAPPING = 2
    RUNNING = 3
    FAILED = 4
    STOPPED = 5
    COPYING = 6
    TOMBSTONED = 7


_ROLE_PB = {
    Role.LEADER: mpb.LEADER,
    Role.FOLLOWER: mpb.FOLLOWER,
    Role.CANDIDATE: mpb.FOLLOWER,
    Role.PRE_CANDIDATE: mpb.FOLLOWER,
    Role.LEARNER: mpb.LEARNER,
    Role.NON_PARTICIPANT: mpb.NON_PARTICIPANT,
}


_TSERVER = TServerConfig(data_dir=Path("tablet-settings"))
"""TServerConfig with its defaults: the one home of the mirrored defaults below (its data_dir
is never opened)."""


@dataclass(frozen=True)
class TabletSettings:
    """The settings every replica of a server shares. A field mirroring a TServerConfig knob
    (`from_config` copies them) takes its default from a default TServerConfig, never written
    here again; `flush_rows`, `flush_bytes` and `compact_files` are this class's own."""

    node: NodeSettings
    wal_segment_bytes: int = _TSERVER.wal.segment_size_bytes
    wal_preallocate: bool = _TSERVER.wal.preallocate
    fsync: bool = _TSERVER.wal.fsync
    flush_rows: int = 100_000
    """Converting the in-memory store to Arrow holds the GIL (about 0.2 s per 100k rows):
    small flushes keep every other tablet's Raft loop responsive."""
    flush_bytes: int = 64 << 20
    compact_files: int = 4
    flush_idle_s: float = _TSERVER.flush_idle_ms / 1000
    """A memstore that has taken no write for this long is flushed, and files whose key ranges
    overlap are then compacted, so a tablet that went cold is read from sorted files without
    merging (and its WAL replay is short). 0: never."""
    on_wal_sync: Callable[[float], None] | None = field(default=None, compare=False)
    """Observes every WAL fdatasync of every replica (the server's fsync histogram)."""
    on_rows_written: Callable[[int], None] | None = field(default=None, compare=False)
    """Told the rows each Write applied on this replica as leader (the server's counter)."""
    history_max_age_s: float = _TSERVER.tablet_history_max_age_ms / 1000
    """How long superseded versions are kept for snapshot reads (`tablet_history_max_age_ms`,
    Kudu's 15 minutes): a compaction drops what only older snapshots could read, and a read
    older than this is refused (docs/design/tablets.md#R5)."""
    clock: HybridClock = field(default_factory=HybridClock, compare=False)
    """The server's hybrid clock: shared by every replica of the server (one settings object
    per server), moved by every committed timestamp it applies."""
    txn_max_staged_rows: int = _TSERVER.txn_max_staged_rows
    """Rows all unresolved transactions may stage on one tablet (held in memory until they
    end)."""
    txn_lock_wait_s: float = _TSERVER.txn_lock_wait_ms / 1000
    """How long a write waits for a row another transaction holds before it fails ABORTED
    (docs/design/transactions.md#R2)."""
    register_txn: RegisterTxn | None = field(default=None, compare=False)
    """How a tablet's leader has the coordinator register it as a participant of a
    transaction, for a writer, before the transaction's first write here; None: transactional
    writes are refused (a server with no masters)."""
    ask_leader: AskLeader | None = field(default=None, compare=False)
    """How a follower gets its tablet's leader to move the safe time past a snapshot time
    (`TabletReplica.wait_safe`); None: a follower waits for writes to move it."""

    @classmethod
    def from_config(cls, config: TServerConfig, node: NodeSettings, **extra: Any) -> TabletSettings:
        """The settings of a server started with `config`, its replicas' Raft settings
        `node`, then `extra` by field name (the server's hooks)."""
        knobs: dict[str, Any] = {
            "wal_segment_bytes": config.wal.segment_size_bytes,
            "wal_preallocate": config.wal.preallocate,
            "fsync": config.wal.fsync,
            "flush_idle_s": config.flush_idle_ms / 1000,
            "history_max_age_s": config.tablet_history_max_age_ms / 1000,
            "clock": HybridClock(config.max_clock_error_ms * 1000),
            "txn_max_staged_rows": config.txn_max_staged_rows,
            "txn_lock_wait_s": config.txn_lock_wait_ms / 1000,
        }
        return cls(node=node, **{**knobs, **extra})


RegisterTxn = Callable[[int, str, str, float], Awaitable[int]]
"""(txn id, tablet id, writer, timeout): register the tablet as a participant of the
transaction on the writer's behalf (the coordinator checks the writer owns it and it is open);
returns the transaction's start timestamp."""

TxnStateOf = Callable[[int, float], Awaitable[str]]
"""(txn id, timeout): the transaction's state at its coordinator (OPEN, COMMITTING, COMMITTED,
ABORTED, or NOT_FOUND when it has no record of it)."""

AskLeader = Callable[[str, str, int, float], Awaitable[None]]
"""(leader uuid, tablet id, timestamp, timeout): ask the tablet's leader to move the tablet's
safe time to at least the timestamp (AdvanceSafeTime)."""


class TabletStateMachine:
    """The RaftNode's state machine: decodes entries and applies them to the RowStore."""

    def __init__(self, replica: TabletReplica) -> None:
        self.replica = replica

    def apply(self, index: int, data: bytes) -> object:
        """Apply entry `index`; if it cannot be applied, fail this replica only (module
        docstring) and raise, which stops the Raft loop of this group and no other."""
        try:
            return self._apply(index, data)
        except Exception as e:
            cause = str(e) if isinstance(e, TesseraError) else f"{type(e).__name__}: {e}"
            err = Corruption(
                f"tablet {self.replica.tablet_id}: log entry {index} could not be applied: {cause}"
            )
            self.replica.fail_apply(err)
            raise err from e

    def _apply(self, index: int, data: bytes) -> object:
        r = self.replica
        store = r.store
        assert store is not None
        kind, body = data[:1], data[1:]
        if kind == _WRITE_AT:
            (ts,) = _TS.unpack_from(body)
            r.observe(ts)
            result = store.apply_write(index, WriteBatch.decode(body[8:], store.schema), ts)
            r.after_apply()
            return result
        if kind == _WRITE_REQ:
            (ts,) = _TS.unpack_from(body)
            rid = RequestId.decode(body[8 : 8 + RequestId.ENCODED_BYTES])
            r.observe(ts)
            batch = WriteBatch.decode(body[8 + RequestId.ENCODED_BYTES :], store.schema)
            result = store.apply_write(index, batch, ts)
            if not result.skipped:  # replayed past a flush: its outcome is not known here
                errors = tuple((row, e.code, str(e)) for row, e in result.errors)
                r.requests.record(rid, Outcome(result.rows_applied, errors, ts))
            r.after_apply()
            return result
        if kind == _TIMESTAMP:
            (ts,) = _TS.unpack(body)
            r.observe(ts)
            store.note_timestamp(index, ts)
            r.safe_time_moved()
            return ts
        if kind == _WRITE:
            result = store.apply_write(index, WriteBatch.decode(body, store.schema))
            r.after_apply()
            return result
        if kind in txns.KINDS:
            return r.apply_txn(index, txns.decode_entry(data))
        if kind == _ALTER:
            req = tpb.AlterSchemaRequestPB.FromString(body)
            schema = schema_from_pb(req.schema)
            if schema.version > store.schema.version:
                store.alter_schema(index, schema)
                for t in r.txns.txns.values():
                    t.relayout(store.schema)
            else:
                store.note_index(index)
            if req.new_table_name and req.new_table_name != r.superblock.table_name:
                r.rename_table(req.new_table_name)
            r.changed()
            return store.schema.version
        raise InvalidArgument(f"tablet {r.tablet_id}: unknown entry kind {kind!r} at {index}")

    def durable_index(self) -> int:
        """The row store's flushed index: the Raft log is kept from there on (its anchor),
        and from the first entry of any unresolved transaction (whose staged rows live only
        in memory: a restart replays them)."""
        return self.replica.log_anchor_index()

    def anchor(self, index: int) -> bytes:
        return anchor_payload(index)

    def restore(self, data: bytes) -> None:
        """Check the Raft snapshot's anchor against the row store's files at start: they must
        hold every entry up to its index (they are flushed before the anchor is taken, and a
        copy writes both). A snapshot with rows is never sent to a tablet (module docstring)."""
        r = self.replica
        index = anchor_index(data, r.tablet_id)
        flushed = r.store.flushed_index if r.store is not None else 0
        if flushed < index:
            raise Corruption(
                f"tablet {r.tablet_id}: the Raft log was dropped up to index {index}, but the "
                f"row store's files hold entries only up to {flushed}: data files lost"
            )


_ANCHOR = b"TESSERA-ANCHOR 1\n"


def anchor_payload(index: int) -> bytes:
    """A tablet's Raft snapshot payload: no rows, the index its row store's files hold."""
    return _ANCHOR + _SNAP_INDEX.pack(index)


def anchor_index(data: bytes, tablet_id: str) -> int:
    if not data.startswith(_ANCHOR) or len(data) != len(_ANCHOR) + _SNAP_INDEX.size:
        raise Corruption(f"tablet {tablet_id}: the Raft snapshot is not a tablet anchor")
    (index,) = _SNAP_INDEX.unpack_from(data, len(_ANCHOR))
    return int(index)


class TabletReplica:
    """One replica (module docstring). Owned by the tablet manager; `start()`/`aclose()`."""

    def __init__(
        self,
        directory: Path,
        sb: Superblock,
        uuid: NodeId,
        transport: Sender,
        settings: TabletSettings,
        on_change: Callable[[str], None],
    ) -> None:
        self.dir = directory
        self.superblock = sb
        self.uuid = uuid
        self.transport = transport
        self.settings = settings
        self._on_change = on_change
        self.state = ReplicaState.NOT_STARTED
        self.error: TesseraError | None = None
        self.store: RowStore | None = None
        self.node: RaftNode | None = None
        self._flush_task: asyncio.Task[None] | None = None
        self._watch_task: asyncio.Task[None] | None = None
        self._node_stop: asyncio.Task[None] | None = None
        """The Raft node's stop, once the replica failed while it ran (`_fail`)."""
        self._handoff: asyncio.Task[None] | None = None
        """A leadership transfer away from this server while its clock is stepped
        (`clock_refusal`)."""
        self._last_apply = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._placement: Placement | None = None
        self._safe_waiters: list[tuple[int, asyncio.Future[None]]] = []
        """Snapshot reads waiting for the safe time to reach their timestamp (`wait_safe`)."""
        self._bump: tuple[int, asyncio.Future[None]] | None = None
        """The timestamp entry this leader is replicating, if any, and its outcome."""
        self.txns = TabletTxns()
        """Unresolved transactions (txn_staging.py): applied from the log on every replica."""
        self.locks = RowLocks()
        """The leader's row locks, rebuilt from `txns` at the start of each term it leads."""
        self._locks_term = -1
        self._beginning: dict[int, asyncio.Future[None]] = {}
        """Transactions whose BEGIN this leader is registering and replicating."""
        self._txn_seen: dict[int, float] = {}
        """When this leader's sweep first saw each unresolved transaction (`sweep_txns`)."""
        self.requests = RequestTracker()
        """Outcomes of the named plain writes applied here (request_tracker.py)."""

    # --- identity ----------------------------------------------------------------------------

    @property
    def tablet_id(self) -> str:
        return self.superblock.tablet_id

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def raft_dir(self) -> Path:
        return self.dir / "raft"

    # --- lifecycle ---------------------------------------------------------------------------

    @staticmethod
    def format(
        directory: Path,
        sb: Superblock,
        schema: Schema,
        uuid: NodeId,
        config: RaftConfig,
        addresses: dict[str, str],
        settings: TabletSettings,
    ) -> None:
        """Create a new replica's directories; the READY superblock is written last (module
        docstring of superblock.py), so a crash before it leaves a directory startup deletes."""
        directory.mkdir(parents=True, exist_ok=True)
        RowStore.create(directory / "data", schema).close()
        store, _ = RaftStore.open(
            RealFileSystem(),
            str(directory / "raft"),
            uuid,
            bootstrap_config=config,
            addresses=addresses,
            segment_bytes=settings.wal_segment_bytes,
            preallocate=settings.wal_preallocate,
            fsync=settings.fsync,
        )
        store.close()
        sbmod.save(directory, sb.with_state(DataState.READY))

    async def start(self) -> None:
        """Open the RowStore and the Raft group and start replicating. On failure the
        replica is FAILED with `error` set (it is reported, and stays offline)."""
        self.state = ReplicaState.BOOTSTRAPPING
        try:
            self.store = await asyncio.to_thread(RowStore.open, self.data_dir)
            raft_store, recovered = await asyncio.to_thread(
                RaftStore.open,
                RealFileSystem(),
                str(self.raft_dir),
                self.uuid,
                segment_bytes=self.settings.wal_segment_bytes,
                preallocate=self.settings.wal_preallocate,
                fsync=self.settings.fsync,
                on_wal_sync=self.settings.on_wal_sync,
            )
            node = RaftNode(
                group_id=self.tablet_id,
                uuid=self.uuid,
                store=raft_store,
                recovered=recovered,
                state_machine=TabletStateMachine(self),
                transport=self.transport,
                settings=self.settings.node,
                quiescence=getattr(self.transport, "quiescence", None),
            )
        except Exception as e:
            self._fail(e)
            return
        self.node = node
        node.listeners.append(self._on_leader_change)
        await node.start()
        self._watch_task = asyncio.create_task(self._watch(node), name=f"watch-{self.tablet_id}")
        self.state = ReplicaState.RUNNING
        self.changed()

    async def aclose(self) -> None:
        """Stop: the Raft node (fails waiters, closes the WAL), then the RowStore."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch_task
        if self._flush_task is not None:
            with contextlib.suppress(Exception):
                await self._flush_task
        if self._handoff is not None:
            self._handoff.cancel()
        if self._node_stop is not None:
            await self._node_stop
        if self.node is not None:
            await self.node.aclose()
        if self.store is not None:
            self.store.close()
        if self.state is not ReplicaState.FAILED:
            self.state = ReplicaState.STOPPED

    async def _watch(self, node: RaftNode) -> None:
        """Fail the replica once its Raft loop stops, then close the node: a stopped loop
        never reads its inbox, so an open node would keep queueing the leader's messages."""
        await node.fatal_event.wait()
        self._fail(node.fatal or IOFatal("raft loop stopped"))
        await node.aclose()

    def fail_apply(self, err: Corruption) -> None:
        """Entry application failed (`TabletStateMachine.apply`): no more files are written,
        so the next start replays the same entry, and the replica is FAILED at once, before a
        flush already scheduled could run."""
        if self.store is not None:
            self.store.fail(str(err))
        self._fail(err)

    def _fail(self, e: BaseException) -> None:
        """FAILED with `e` as the error; the first failure is kept (what follows it, a flush
        refused by the failed store, or the stopped Raft loop, is its consequence).

        A FAILED replica serves nothing, so its Raft node stops too if it still runs (a failed
        flush): left running, a failed leader would keep its followers from electing another
        while refusing every read and write, and the tablet would be unwritable until this
        server restarted. Stopped, it is to its group what a dead server is: the others elect
        a leader, and the master replaces the replica (docs/design/tablet_copy.md#R2)."""
        if self.state is ReplicaState.FAILED:
            return
        log.error("tablet %s failed: %s", self.tablet_id, e)
        self.state = ReplicaState.FAILED
        self.error = e if isinstance(e, TesseraError) else IOFatal(f"{type(e).__name__}: {e}")
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        node = self.node
        if node is not None and node.fatal is None and self._node_stop is None:
            self._node_stop = asyncio.get_running_loop().create_task(
                node.aclose(), name=f"stop-failed-{self.tablet_id}"
            )
        self.changed()

    def delete_files(self) -> None:
        """Remove the data and the WAL, keeping consensus metadata (a tombstone)."""
        shutil.rmtree(self.data_dir, ignore_errors=True)
        wal = self.raft_dir / "wal"
        shutil.rmtree(wal, ignore_errors=True)
        snap = self.raft_dir / "snapshot"
        snap.unlink(missing_ok=True)

    # --- change notification (for tablet reports) -------------------------------------------

    def changed(self) -> None:
        self._on_change(self.tablet_id)

    def _on_leader_change(self, change: LeaderChange) -> None:
        self.changed()

    def rename_table(self, name: str) -> None:
        self.superblock = Superblock(**{**self.superblock.__dict__, "table_name": name})
        sbmod.save(self.dir, self.superblock)

    # --- the write path ----------------------------------------------------------------------

    def running_node(self) -> RaftNode:
        if self.state is not ReplicaState.RUNNING or self.node is None or self.store is None:
            detail = f": {self.error}" if self.error is not None else ""
            raise TabletNotRunning(
                f"tablet {self.tablet_id} is {self.state.name} on this server{detail}"
            )
        return self.node

    async def write(
        self, req: tpb.WriteRequestPB, timeout: float, writer: str = ""
    ) -> tpb.WriteResponsePB:
        """A client's write (plain, or staged in a transaction: `req.txn_id`), from `writer`
        (the caller's identity: a transaction takes writes only from its owner)."""
        node = self.running_node()
        if node.status().role is not Role.LEADER:
            raise node.not_leader_error()
        store = self.store
        assert store is not None
        if req.schema_version > store.schema.version:
            raise FailedPrecondition(
                f"tablet {self.tablet_id}: the write uses schema version {req.schema_version}, "
                f"newer than this replica's {store.schema.version}; retry shortly"
            )
        txn_id = int(req.txn_id)
        rid = RequestId.from_request(req)
        if rid is not None and txn_id:
            raise InvalidArgument(
                "request_id names a plain write: a transaction's writes are made once by its "
                "commit (docs/design/transactions.md#R2)"
            )
        if txn_id:
            if len(req.txn_attempt.encode()) > txns.MAX_ATTEMPT_BYTES:
                raise InvalidArgument(f"txn_attempt: longer than {txns.MAX_ATTEMPT_BYTES} bytes")
            await self._begin_txn(node, txn_id, writer, timeout)
        # Validating and encoding cost time linear in the request (up to MAX_WRITE_BYTES of
        # row_ops.py), mostly in Arrow calls that release the GIL (full validation, casts, the
        # IPC writer): a worker thread keeps them off the loop that every Raft group of this
        # server shares (service/common/loop_lag.py).
        checked = await asyncio.to_thread(
            validate_write,
            store.schema,
            self.placement(store.schema),
            req.rows,
            int(req.default_op),
            list(req.ops),
        )
        errors: list[tuple[int, TesseraError]] = list(checked.refused)
        rows_applied = 0
        ts = 0
        if checked.entry is not None:
            # Timestamps follow log order (docs/design/tablets.md#R4): a new leader stamps only
            # once what it inherited is applied (its clock has seen those stamps), and the
            # stamp is taken and the entry queued with no await in between.
            await node.wait_term_applied(timeout)
            if rid is not None:
                # Every entry of earlier terms is applied now: a request any of them carried
                # has its outcome recorded here.
                self.requests.forget_below(rid)
                done = await self._request_outcome(node, rid, timeout)
                if done is not None:
                    return self._repeated(node, checked, done)
            if txn_id and checked.batch is not None:
                self._check_staging_room(txn_id, checked.batch.num_rows)
            await self._lock_rows(node, checked, txn_id, timeout)
            if rid is not None:  # another attempt may have got in while the locks were taken
                done = await self._request_outcome(node, rid, timeout)
                if done is not None:
                    return self._repeated(node, checked, done)
            if txn_id:
                entry = txns.stage_entry(txn_id, req.txn_attempt, checked.entry)
                result = await self._propose_resendable(node, entry, timeout)
                if isinstance(result, TxnRefusal):
                    refused = Aborted if result.conflict else FailedPrecondition
                    raise refused(f"tablet {self.tablet_id}: {result.reason}")
            else:
                try:
                    if req.propagated_timestamp:
                        self.settings.clock.update(req.propagated_timestamp)
                    ts = self.settings.clock.now()
                except ClockError as e:
                    raise self.clock_refusal(e) from None
                if rid is None:
                    entry = stamped(checked.entry, ts)
                else:
                    # No await since the last look at the tracker: a retry arriving from now
                    # on waits for this entry instead of proposing its own.
                    self.requests.mark(rid, node.status().term)
                    entry = named(checked.entry, ts, rid)
                result = await node.propose(entry, timeout=timeout)
            applied = cast(AppliedWrite, result)
            if not txn_id:
                failpoints.hit("write:after_apply")
            rows_applied = applied.rows_applied
            errors.extend((checked.request_row(row), err) for row, err in applied.errors)
            if self.settings.on_rows_written is not None and not txn_id:
                self.settings.on_rows_written(applied.rows_applied)
        resp = tpb.WriteResponsePB(
            applied_index=node.applied,
            rows_applied=rows_applied,
            commit_timestamp=ts or self.settings.clock.now(),
        )
        for row, err in sorted(errors, key=lambda e: e[0]):
            resp.per_row_errors.add(
                row_index=row, error=mpb.ErrorPB(code=err.code, message=str(err))
            )
        return resp

    async def _request_outcome(
        self, node: RaftNode, rid: RequestId, timeout: float
    ) -> Outcome | None:
        """The recorded outcome of request `rid`, after waiting for its entry if an attempt
        of it is in flight on this leader; None: it was never applied, write it."""
        while True:
            done = self.requests.outcome(rid)
            if done is not None:
                return done
            pending = self.requests.in_flight(rid, node.status().term)
            if pending is None:
                return None
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(pending)
            except TimeoutError:
                raise Timeout(
                    f"tablet {self.tablet_id}: an earlier attempt of this write request is "
                    "still being replicated; retry"
                ) from None

    def _repeated(
        self, node: RaftNode, checked: ValidatedWrite, done: Outcome
    ) -> tpb.WriteResponsePB:
        """The reply to a retry of an applied request: its first attempt's outcome (the rows
        refused before replication are refused again: the same request, validated again)."""
        resp = tpb.WriteResponsePB(
            applied_index=node.applied,
            rows_applied=done.rows_applied,
            commit_timestamp=done.commit_timestamp,
        )
        errors = [(row, err.code, str(err)) for row, err in checked.refused]
        errors += [(checked.request_row(row), code, msg) for row, code, msg in done.errors]
        for row, code, msg in sorted(errors, key=lambda e: e[0]):
            resp.per_row_errors.add(row_index=row, error=mpb.ErrorPB(code=code, message=msg))
        return resp

    # --- transactions (docs/design/transactions.md, txn_staging.py) -------------------------

    async def _begin_txn(self, node: RaftNode, txn_id: int, writer: str, timeout: float) -> None:
        """Make sure transaction `txn_id` has begun here for `writer`: its first write here
        has the coordinator register this tablet as a participant (refused unless the
        transaction is open and the writer owns it), then replicates a BEGIN entry. One
        registration per transaction at a time; later writes find the state and check the
        owner here."""
        while True:
            t = self.txns.txns.get(txn_id)
            if t is not None:
                if t.owner != writer:
                    raise PermissionDenied(
                        f"transaction {txn_id} belongs to {t.owner or 'nobody'!r}, not "
                        f"{writer!r}: only its owner writes in it"
                    )
                if t.prepare_ts:
                    raise FailedPrecondition(
                        f"transaction {txn_id} is committing: its writes ended when its commit "
                        "began"
                    )
                return
            if txn_id in self.txns.recently_ended:
                raise FailedPrecondition(
                    f"transaction {txn_id} has ended on tablet {self.tablet_id}"
                )
            pending = self._beginning.get(txn_id)
            if pending is not None:
                with contextlib.suppress(TesseraError):
                    await asyncio.shield(pending)
                continue
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._beginning[txn_id] = fut
            try:
                register = self.settings.register_txn
                if register is None:
                    raise FailedPrecondition(
                        f"tablet {self.tablet_id}: this server has no coordinator to register "
                        "transactions with"
                    )
                start_ts = await register(txn_id, self.tablet_id, writer, timeout)
                entry = txns.begin_entry(txn_id, start_ts, writer)
                await self._propose_resendable(node, entry, timeout)
                fut.set_result(None)
            except BaseException as e:
                fut.set_exception(e if isinstance(e, Exception) else Timeout("cancelled"))
                raise
            finally:
                self._beginning.pop(txn_id, None)

    async def _propose_resendable(self, node: RaftNode, entry: bytes, timeout: float) -> Any:
        """`node.propose` for an entry of a transaction's write: its begin, or its staged rows.
        An entry that loses its place in the log to a new leader's took effect nowhere, so the
        writer may send the write again to the new leader: that is answered UNAVAILABLE, not
        ABORTED, which a transaction's writer takes for a conflict that only running the
        transaction again resolves (docs/design/transactions.md)."""
        try:
            return await node.propose(entry, timeout=timeout)
        except Aborted as e:
            raise ServiceUnavailable(
                f"tablet {self.tablet_id}: {e.message}; send the write again to the new leader"
            ) from e

    def _check_staging_room(self, txn_id: int, rows: int) -> None:
        """Staged rows live in memory until their transaction ends: refuse a write that
        would take this tablet's staged rows past `txn_max_staged_rows` (a load that big
        belongs outside a transaction)."""
        staged = sum(t.rows() for t in self.txns.txns.values())
        limit = self.settings.txn_max_staged_rows
        if staged + rows > limit:
            raise ResourceExhausted(
                f"tablet {self.tablet_id}: transaction {txn_id} would take the rows staged here "
                f"to {staged + rows:,}, past txn_max_staged_rows ({limit:,}): staged rows are "
                "held in memory until their transaction ends; write a load this big outside a "
                "transaction (transactional=false, --no-transactional)"
            )

    async def _lock_rows(
        self, node: RaftNode, checked: ValidatedWrite, txn_id: int, timeout: float
    ) -> None:
        """Wait until no other transaction holds a row of this write, and take them for
        `txn_id` (docs/design/transactions.md#R2). A plain write costs nothing while no
        transaction holds a row of this tablet."""
        term = node.status().term
        if self._locks_term != term:
            self.locks.rebuild(self.txns.locked_keys())
            self._locks_term = term
        if not txn_id and not self.locks.held:
            return
        batch = checked.batch
        if batch is None:
            return
        store = self.store
        assert store is not None
        schema = store.schema
        keys = encode_keys_arrow(schema.key_columns, batch.table)
        await self.locks.acquire(
            keys,
            txn_id or None,
            min(self.settings.txn_lock_wait_s, timeout),
            lambda k: f"tablet {self.tablet_id}: {key_text(schema, k)}",
        )

    def apply_txn(self, index: int, e: txns.TxnEntry) -> object:
        """Apply a transaction entry (TabletStateMachine); deterministic in the log."""
        store = self.store
        assert store is not None
        if e.kind == txns.BEGIN:
            self.txns.begin(index, e.txn_id, e.owner, e.ts)
            store.note_index(index)
            return None
        if e.kind == txns.STAGE:
            staging = self.txns.stage(e.txn_id)
            if isinstance(staging, TxnRefusal):
                store.note_index(index)
                return staging
            batch = WriteBatch.decode(e.write, store.schema)
            store.note_index(index)
            conflict = store.write_conflict(
                batch, staging.start_ts, [m.rows for m in staging.attempts.values()]
            )
            if conflict is not None:
                return TxnRefusal(
                    f"write conflict in transaction {e.txn_id}: {conflict} (the transaction's "
                    "snapshot is older): abort and run it again",
                    conflict=True,
                )
            mem = self.txns.scratch(staging, e.attempt, store.schema, index)
            result, live = store.stage_write(batch, mem)
            staging.live_delta[e.attempt] = staging.live_delta.get(e.attempt, 0) + live
            return result
        if e.kind == txns.PREPARE:
            self.observe(e.ts)
            prepared = self.txns.prepare(index, e.txn_id, e.ts)
            store.note_timestamp(index, e.ts)  # the replica's safe time is capped below it
            return prepared
        if e.kind == txns.COMMIT:
            self.observe(e.ts)
            t = self.txns.txns.get(e.txn_id)
            if t is None or not t.prepare_ts:
                # Resolved here already (a repeated commit), or never prepared here: nothing
                # of it is staged (an unprepared state is a write that came after the commit
                # began, which the commit does not take).
                if e.final:
                    self.txns.resolve(e.txn_id)
                    self.locks.release(e.txn_id)
                store.note_index(index)
                return e.ts
            items, layout = t.commit_write(e.kept)
            if e.start == t.committed_upto and e.end > e.start:
                # Skipped at or below the flushed index (a replay: the files hold it).
                live = t.kept_live_delta(e.kept) if e.start == 0 else 0
                store.apply_staged(index, items[e.start : e.end], layout, e.ts, live)
                t.committed_upto = e.end
            else:
                store.note_index(index)
            if e.final and t.committed_upto >= len(items):
                self.txns.resolve(e.txn_id)
                self.locks.release(e.txn_id)
                self.txns.pin(t, index)
            self.after_apply()
            return e.ts
        self.txns.resolve(e.txn_id)
        self.locks.release(e.txn_id)
        store.note_index(index)  # ABORT: the staged rows are dropped with the state
        self.safe_time_moved()
        return None

    async def _commit_parts(
        self, node: RaftNode, txn_id: int, ts: int, kept: list[str] | None, timeout: float
    ) -> None:
        """Replicate the transaction's commit here, in parts of at most COMMIT_PART_ROWS rows
        (one entry's apply is short), from where an earlier leader's parts left off; the last
        part resolves it. A transaction resolved here already takes one entry that changes
        nothing (the coordinator's repeat)."""
        store = self.store
        assert store is not None
        while True:
            t = self.txns.txns.get(txn_id)
            if t is None or not t.prepare_ts:
                await node.propose(txns.commit_entry(txn_id, ts, kept), timeout=timeout)
                return
            items, _ = t.commit_write(kept)
            total = len(items)
            start = t.committed_upto
            end = min(total, start + txns.COMMIT_PART_ROWS)
            final = end >= total
            await node.propose(
                txns.commit_entry(txn_id, ts, kept, start, end, final), timeout=timeout
            )
            if final:
                return

    async def sweep_txns(self, state_of: TxnStateOf, min_age_s: float, timeout: float) -> int:
        """As leader, drop the staged state of transactions nobody will resolve here: an
        unresolved transaction older than `min_age_s` (on this leader's watch) whose record
        the coordinator does not have (never begun, or purged), says ABORTED, or says
        COMMITTED while nothing of it was prepared here (a write that began here after the
        transaction's commit did: not part of it). Its rows and locks go, the safe time and
        the WAL move on. Anything the coordinator may still act on is left to it. Returns how
        many were dropped."""
        node = self.running_node()
        if node.status().role is not Role.LEADER:
            self._txn_seen.clear()
            return 0
        now = asyncio.get_running_loop().time()
        self._txn_seen = {k: v for k, v in self._txn_seen.items() if k in self.txns.txns}
        dropped = 0
        for txn_id, t in list(self.txns.txns.items()):
            if now - self._txn_seen.setdefault(txn_id, now) < min_age_s:
                continue
            state = await state_of(txn_id, timeout)
            orphan = state in ("NOT_FOUND", "ABORTED") or (
                state == "COMMITTED" and not t.prepare_ts
            )
            if orphan and txn_id in self.txns.txns:
                log.info(
                    "tablet %s: dropping the staged rows of transaction %d (%s at its coordinator)",
                    self.tablet_id,
                    txn_id,
                    state,
                )
                await node.propose(txns.abort_entry(txn_id), timeout=timeout)
                dropped += 1
        return dropped

    def log_anchor_index(self) -> int:
        """Where the WAL may be dropped up to (the state machine's durable index)."""
        store = self.store
        if store is None:
            return 0
        flushed = store.flushed_index
        self.txns.unpin(flushed)
        first = self.txns.first_index()
        return flushed if first is None else min(flushed, first - 1)

    async def txn_op(self, req: tpb.TxnParticipantOpRequestPB, timeout: float) -> int:
        """The coordinator's prepare, commit or abort of a transaction here (the leader
        replicates it); a prepare answers with its prepare timestamp (repeated: the same)."""
        node = self.running_node()
        if node.status().role is not Role.LEADER:
            raise node.not_leader_error()
        txn_id = int(req.txn_id)
        if txn_id <= 0:
            raise InvalidArgument("txn_id: required")
        await node.wait_term_applied(timeout)
        clock = self.settings.clock
        if req.op == tpb.TxnParticipantOpRequestPB.PREPARE:
            done = self.txns.prepare_timestamp(txn_id)
            if done:
                return done
            try:
                stamp = clock.now()
            except ClockError as e:
                raise self.clock_refusal(e) from None
            prepared = cast(int, await node.propose(txns.prepare_entry(txn_id, stamp), timeout))
            failpoints.hit("txn_participant:after_prepare")
            return prepared
        if req.op == tpb.TxnParticipantOpRequestPB.COMMIT:
            ts = int(req.commit_timestamp)
            if not ts:
                raise InvalidArgument("commit_timestamp: required for COMMIT")
            try:
                clock.check(ts)
                # What this leader stamps next comes after the commit (tablets.md#R4).
                clock.update(ts)
            except ClockError as e:
                raise self.clock_refusal(e) from None
            kept = list(req.kept_attempts) if req.kept_attempts else None
            await self._commit_parts(node, txn_id, ts, kept, timeout)
            failpoints.hit("txn_participant:after_commit")
            return ts
        if req.op == tpb.TxnParticipantOpRequestPB.ABORT:
            await node.propose(txns.abort_entry(txn_id), timeout=timeout)
            return 0
        raise InvalidArgument(f"op: unknown transaction operation {req.op}")

    def placement(self, schema: Schema) -> Placement | None:
        """This tablet's partition under `schema` (cached per schema version); None when the
        partition covers every key, so no row can be outside it. A superblock whose partition
        does not decode stops writes rather than let them through unchecked."""
        cached = self._placement
        if cached is not None and cached.schema_version == schema.version:
            return cached
        sb = self.superblock
        try:
            partition = partition_from_pb(cpb.PartitionPB.FromString(sb.partition_pb))
            if not partition.partition_key_start and not partition.partition_key_end:
                return None
            ps = partition_schema_from_pb(
                cpb.PartitionSchemaPB.FromString(sb.partition_schema_pb), schema
            )
        except (InvalidArgument, DecodeError) as e:
            raise FailedPrecondition(
                f"tablet {self.tablet_id}: its recorded partition does not decode ({e}); "
                "writes are refused rather than applied unchecked"
            ) from None
        self._placement = Placement(schema.version, ps, partition)
        return self._placement

    async def alter_schema(self, req: tpb.AlterSchemaRequestPB, timeout: float) -> int:
        node = self.running_node()
        store = self.store
        assert store is not None
        schema = schema_from_pb(req.schema)
        if schema.version <= store.schema.version and not req.new_table_name:
            return store.schema.version  # idempotent: already there
        if node.status().role is not Role.LEADER:
            raise node.not_leader_error()
        entry = tpb.AlterSchemaRequestPB(
            schema=schema_to_pb(schema), new_table_name=req.new_table_name
        )
        return cast(int, await node.propose(_ALTER + entry.SerializeToString(), timeout=timeout))

    def observe(self, ts: int) -> None:
        """An applied entry's commit timestamp: the server's clock moves past it."""
        if self.settings.clock.observe(ts):
            log.warning(
                "tablet %s: applied an entry stamped %s, further ahead of this server's wall "
                "clock than max_clock_error_ms: check the clocks' synchronization",
                self.tablet_id,
                describe(ts),
            )

    def safe_time_moved(self) -> None:
        """Wake the snapshot reads whose timestamp the safe time reached."""
        store = self.store
        if store is None or not self._safe_waiters:
            return
        safe = self.safe_time
        waiting = []
        for ts, fut in self._safe_waiters:
            if ts <= safe:
                if not fut.done():
                    fut.set_result(None)
            elif not fut.done():
                waiting.append((ts, fut))
        self._safe_waiters = waiting

    def after_apply(self) -> None:
        self.safe_time_moved()
        store = self.store
        if store is None:
            return
        s = self.settings
        loop = asyncio.get_running_loop()
        self._last_apply = loop.time()
        if s.flush_idle_s > 0 and self._idle_timer is None:
            self._idle_timer = loop.call_at(self._last_apply + s.flush_idle_s, self._on_idle)
        if self._flush_task is not None and not self._flush_task.done():
            return
        if store.memstore_rows() >= s.flush_rows or store.memstore_bytes() >= s.flush_bytes:
            self._flush_task = loop.create_task(self._flush(store))

    def _on_idle(self) -> None:
        """The idle timer (armed by the first apply after the last idle flush) fired: flush
        and compact overlapping files if no write came for `flush_idle_s`, else wait more."""
        self._idle_timer = None
        store = self.store
        if store is None or self.state is not ReplicaState.RUNNING:
            return
        loop = asyncio.get_running_loop()
        due = self._last_apply + self.settings.flush_idle_s
        if loop.time() < due or (self._flush_task is not None and not self._flush_task.done()):
            self._idle_timer = loop.call_at(
                max(due, loop.time() + self.settings.flush_idle_s / 4), self._on_idle
            )
            return
        self._flush_task = loop.create_task(self._flush(store, idle=True))

    async def _flush(self, store: RowStore, idle: bool = False, compact: bool = True) -> None:
        """Flush the memstore; then (with `compact`) compact every file if there are more
        than `compact_files`, or, when the tablet is idle, each group of overlapping files."""
        try:
            frozen = store.freeze()
            if frozen is not None:
                await asyncio.to_thread(store.write_frozen, frozen)
                if store is not self.store:
                    return
                # The manifest's fsyncs wait for the disk in a worker thread; reads and the
                # WAL's anchor move on once it is durable (rowstore.py, Installs).
                store.stage_install(frozen)
                await asyncio.to_thread(store.write_manifest)
                store.finish_install(frozen)
            elif not compact and (index := store.stage_advance(self._raft_applied())) is not None:
                # For a copy: its image is taken at the flushed index, and the new replica's
                # config is the one as of that index. Config changes applied since the last
                # row (a move's own ADD_PEER among them) must be in it, or the replica starts
                # with a config that does not name the leader copying to it.
                await asyncio.to_thread(store.write_manifest)
                store.finish_advance(index)
            if not compact:
                return
            files = sum(1 for f in store.data_files() if f.endswith(".arrow"))
            overlapping = files <= self.settings.compact_files
            if overlapping and not idle:
                return
            while store is self.store:
                c = store.prepare_compaction(
                    overlapping=overlapping, horizon=self._compaction_horizon(store)
                )
                if c is None:
                    break
                await asyncio.to_thread(store.write_compaction, c)
                if store is not self.store:
                    break
                store.stage_compaction(c)
                await asyncio.to_thread(store.write_manifest)
                store.finish_compaction(c)
                await asyncio.to_thread(store.remove_compacted, c)
                if not overlapping:
                    break
        except Exception as e:  # a failed flush: the WAL still has everything; stop the replica
            self._fail(e)

    async def flush(self) -> None:
        """Flush now (tests, shutdown of a tablet that is being copied)."""
        if self._flush_task is not None:
            await self._flush_task
        if self.store is not None:
            await self._flush(self.store)

    def _raft_applied(self) -> int:
        return self.node.applied if self.node is not None else 0

    async def flush_for_copy(self) -> RowStore:
        """Make everything applied so far durable in the row store's files, without
        compacting, and return the store: a copy session then links its files (tablet_copy).
        Runs as the tablet's flush task, after any under way, so no other flush interleaves
        (frozen memstores install in freeze order)."""
        while self._flush_task is not None and not self._flush_task.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._flush_task)
        store = self.store
        if store is None:
            raise TabletNotRunning(f"tablet {self.tablet_id} has no row store open")
        task = asyncio.get_running_loop().create_task(self._flush(store, compact=False))
        self._flush_task = task
        await asyncio.shield(task)
        self.running_node()  # a failed flush failed the replica: no copy from it
        if store is not self.store:
            raise TabletNotRunning(f"tablet {self.tablet_id} was restarted during a flush")
        return store

    # --- reads -------------------------------------------------------------------------------

    async def wait_readable(self, read_at_leader: bool, min_index: int, timeout: float) -> None:
        node = self.running_node()
        if read_at_leader:
            await node.read(timeout=timeout)
        if min_index:
            await node.wait_applied(min_index, timeout=timeout)

    # --- snapshots (docs/design/tablets.md#R4, #R5) ------------------------------------------

    @property
    def safe_time(self) -> int:
        """Every entry stamped at or before this is applied here, and none that commits later
        can be (the newest stamp applied: stamps follow log order)."""
        if self.store is None:
            return 0
        cap = self.txns.safe_time_cap()
        safe = self.store.safe_time
        return safe if cap is None else min(safe, cap)

    def history_horizon(self) -> int:
        """The oldest time a snapshot read may ask for: `history_max_age_s` ago, and never
        before what a compaction here already dropped."""
        store = self.store
        floor = store.history_horizon if store is not None else 0
        return max(floor, self._gc_horizon())

    def _gc_horizon(self) -> int:
        """The horizon a compaction starting now keeps versions for: `history_max_age_s` ago
        on this server's hybrid clock (docs/design/tablets.md#R5)."""
        age_us = int(self.settings.history_max_age_s * 1_000_000)
        return from_micros(max(0, physical_us(self.settings.clock.now()) - age_us))

    def _compaction_horizon(self, store: RowStore) -> int:
        """The horizon to give a compaction: the current one once it has moved a quarter of
        `history_max_age_s` (at least a minute) past the store's, else the store's own. A
        file with history is rewritten to drop old versions at most that often, not on every
        idle flush (docs/design/tablets.md#R5).

        While this server's clock refuses to tell the time (stepped, or behind what it handed
        out: hybrid_time.py), the store's own horizon: the compaction keeps every version it
        kept before, and the replica goes on. A ClockError here used to fail the replica, and
        a failed leader left the tablet unwritable until its server restarted."""
        try:
            horizon = self._gc_horizon()
        except ClockError:
            return store.history_horizon
        gap_us = max(60.0, self.settings.history_max_age_s / 4) * 1_000_000
        if physical_us(horizon) - physical_us(store.history_horizon) >= gap_us:
            return horizon
        return store.history_horizon

    def check_snapshot_time(self, ts: int) -> None:
        """Refuse a snapshot time this replica cannot answer exactly: older than the history
        horizon (SnapshotTooOld, naming it), or further in the future than the clock bound
        (ClockError)."""
        horizon = self.history_horizon()
        if ts < horizon:
            raise SnapshotTooOld(
                f"tablet {self.tablet_id}: snapshot time {describe(ts)} is older than the "
                f"history horizon {describe(horizon)} (tablet_history_max_age_ms "
                f"{self.settings.history_max_age_s * 1000:.0f}): the versions it needs may be "
                "gone"
            )
        self.settings.clock.check(ts)

    async def wait_safe(self, ts: int, timeout: float) -> None:
        """Wait until this replica's safe time reaches `ts`, then a read at `ts` is exact and
        the same on every replica (docs/design/tablets.md#R4). Writes move the safe time; on a
        quiet tablet the leader replicates a timestamp entry, asked by a follower if need be.

        A follower asks again every few hundred milliseconds (backing off to 2 s) until the
        deadline: right after a restart or an election it may know no leader, or not yet its
        address, and one lost ask would otherwise leave a read of a quiet tablet waiting for a
        write that never comes."""
        node = self.running_node()
        if self.safe_time >= ts:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.settings.clock.update(ts)  # what this server stamps next comes after `ts`
        fut: asyncio.Future[None] = loop.create_future()
        self._safe_waiters.append((ts, fut))
        pause = 0.25
        try:
            while self.safe_time < ts:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError
                ask = self.settings.ask_leader
                leader = node.status().lead
                if node.status().role is Role.LEADER:
                    # Past this, only a prepared transaction holds the safe time back: its
                    # resolution wakes the wait below. A leadership lost meanwhile (the
                    # timestamp entry overwritten by a new leader, or no longer the leader)
                    # is no failure of the read: the next turn asks the new leader.
                    with contextlib.suppress(Aborted, NotTheLeader):
                        await self._advance_safe_time(ts, remaining)
                elif ask is not None and leader:
                    with contextlib.suppress(TesseraError, TimeoutError):
                        # Best effort: the leader's entry reaches this replica like any other;
                        # whatever failed, the wait below says how it ended.
                        async with asyncio.timeout(min(remaining, max(1.0, remaining / 4))):
                            await ask(leader, self.tablet_id, ts, remaining)
                if self.safe_time >= ts:
                    break
                wait = min(pause, max(0.0, deadline - loop.time()))
                pause = min(2.0, pause * 2)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await asyncio.shield(fut)
        except TimeoutError:
            held = self.txns.safe_time_cap()
            why = (
                "a transaction prepared here is not resolved yet"
                if held is not None and held < ts
                else "a lagging replica, or no leader"
            )
            raise Timeout(
                f"tablet {self.tablet_id}: the safe time here ({describe(self.safe_time)}) did "
                f"not reach the snapshot time {describe(ts)} within {timeout:.1f}s ({why}): "
                "retry, or read another replica"
            ) from None
        finally:
            if not fut.done():
                fut.cancel()
            self._safe_waiters = [(t, f) for t, f in self._safe_waiters if f is not fut]

    async def advance_safe_time(self, ts: int, timeout: float) -> int:
        """As leader, make the safe time reach `ts` (AdvanceSafeTime from a follower): returns
        the index a follower must apply for it."""
        node = self.running_node()
        if node.status().role is not Role.LEADER:
            raise node.not_leader_error()
        try:
            self.check_snapshot_time(ts)
            self.settings.clock.update(ts)
        except ClockError as e:
            raise self.clock_refusal(e) from None
        if self.safe_time < ts:
            await self._advance_safe_time(ts, timeout)
        return node.applied

    async def _advance_safe_time(self, ts: int, timeout: float) -> None:
        """Replicate a timestamp entry stamped after `ts`, unless a write or another such entry
        already under way will do: one entry serves every read waiting meanwhile."""
        node = self.running_node()
        store = self.store
        assert store is not None
        # The store's safe time, not the replica's: a prepared transaction holds the latter
        # back until it is resolved, and no timestamp entry moves it (docs/design/
        # transactions.md#R3).
        while store.safe_time < ts:
            bump = self._bump
            if bump is not None and not bump[1].done():
                await asyncio.shield(bump[1])
                continue
            await node.wait_term_applied(timeout)
            stamp = self.settings.clock.now()
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._bump = (stamp, fut)
            try:
                await node.propose(timestamp_entry(stamp), timeout=timeout)
                fut.set_result(None)
            except BaseException as e:
                fut.set_exception(e if isinstance(e, Exception) else Timeout("cancelled"))
                raise

    def scan(self, spec: ScanSpec) -> Iterator[pa.RecordBatch]:
        """Batches of `spec` over a snapshot taken now (`RowStore.scan`); nothing costly runs
        before the first batch is asked for, so drain it in a worker thread."""
        self.running_node()
        assert self.store is not None
        return self.store.scan(spec)

    # --- consensus ---------------------------------------------------------------------------

    def consensus_state(self) -> mpb.ConsensusStatePB:
        node = self.node
        cs = mpb.ConsensusStatePB()
        if node is None:
            return cs
        st = node.status()
        cs.current_term = st.term
        cs.leader_uuid = st.lead or ""
        self._config_pb(node.applied_config, cs.committed_config, node)
        if st.config.index > node.applied_config.index:
            self._config_pb(st.config, cs.pending_config, node)
        return cs

    def _config_pb(self, c: RaftConfig, out: mpb.RaftConfigPB, node: RaftNode) -> None:
        out.opid_index = c.index
        for member, kind in [(v, mpb.VOTER) for v in sorted(c.voters)] + [
            (learner, mpb.NON_VOTER) for learner in sorted(c.learners)
        ]:
            peer = out.peers.add(permanent_uuid=member, member_type=kind)
            if kind == mpb.NON_VOTER:
                peer.promote = node.is_promotable(member)
            addr = self.transport.address_of(member) or (
                getattr(self.transport, "own_address", None) if member == self.uuid else None
            )
            if addr:
                host, _, port = addr.rpartition(":")
                peer.last_known_addr.host = host
                peer.last_known_addr.port = int(port)

    def role_pb(self) -> mpb.RaftRolePB.ValueType:
        """The replica's Raft role; unknown once FAILED (its node stopped in whatever role it
        had, and a stopped leader leads nothing)."""
        if self.node is None or self.state is ReplicaState.FAILED:
            return mpb.ROLE_UNKNOWN
        return _ROLE_PB.get(self.node.status().role, mpb.ROLE_UNKNOWN)

    async def change_config(self, req: tpb.ChangeConfigRequestPB, timeout: float) -> None:
        node = self.running_node()
        peer = req.peer.permanent_uuid
        if not peer:
            raise InvalidArgument("peer.permanent_uuid: required")
        expected = (
            req.cas_config_opid_index
            if req.HasField("cas_config_opid_index")
            else node.applied_config.index
        )
        address = None
        promote = False
        if req.type == tpb.ChangeConfigRequestPB.ADD_PEER:
            kind = ConfigChangeType.ADD_LEARNER
            a = req.peer.last_known_addr
            if not a.host or not a.port:
                raise InvalidArgument("peer.last_known_addr: ADD_PEER needs the peer's address")
            address = f"{a.host}:{a.port}"
            promote = _promote_on_add(req.peer)
        elif req.type == tpb.ChangeConfigRequestPB.REMOVE_PEER:
            kind = ConfigChangeType.REMOVE
        elif req.type == tpb.ChangeConfigRequestPB.PROMOTE_PEER:
            kind = ConfigChangeType.PROMOTE
        else:
            raise InvalidArgument(f"type: unknown change type {req.type}")
        await node.change_config(
            kind,
            NodeId(peer),
            address=address,
            expected_index=expected,
            timeout=timeout,
            promote=promote,
        )
        self.changed()

    def clock_refusal(self, e: ClockError) -> TesseraError:
        """The error for a request this replica cannot stamp or check because of `e`.

        When the fault is this server's own wall clock, stepped or set (not a timestamp the
        request brought), another replica can serve the request: it is refused as
        UNAVAILABLE, which clients retry elsewhere, and a leader hands its leadership to a
        replica whose clock may be right, so that the tablet goes on taking writes while one
        server's clock is wrong (docs/design/tablets.md#R4)."""
        if not self.settings.clock.stepped():
            return e
        if self.is_leader() and (self._handoff is None or self._handoff.done()):
            self._handoff = asyncio.get_running_loop().create_task(
                self._hand_off(), name=f"clock-handoff-{self.tablet_id}"
            )
        return ServiceUnavailable(
            f"tablet {self.tablet_id}: {e.message}; another replica can serve this request: "
            "retry there"
        )

    async def _hand_off(self) -> None:
        """Step down in favour of the most caught-up voter (best effort: a failed transfer
        leaves this replica leading, and the next refused request tries again)."""
        with contextlib.suppress(TesseraError, TimeoutError):
            node = self.settings.node
            await self.step_down("", timeout=node.max_election_ticks * node.tick_interval_s)

    async def step_down(self, new_leader: str, timeout: float) -> None:
        node = self.running_node()
        st = node.status()
        if st.role is not Role.LEADER:
            raise node.not_leader_error()
        target = new_leader
        if not target:
            voters = [v for v in st.config.voters if v != self.uuid]
            if not voters:
                raise FailedPrecondition(f"tablet {self.tablet_id}: no other voter to lead")
            target = max(voters, key=lambda v: st.progress[v].match if v in st.progress else 0)
        await node.transfer_leadership(NodeId(target), timeout=timeout)

    # --- status ------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        return (
            self.node is not None
            and self.state is not ReplicaState.FAILED
            and self.node.status().role is Role.LEADER
        )

    def schema_version(self) -> int:
        return self.store.schema.version if self.store is not None else 0

    def not_leader(self) -> NotTheLeader:
        node = self.running_node()
        return node.not_leader_error()


def _promote_on_add(peer: mpb.RaftPeerPB) -> bool:
    """Whether a peer added by ADD_PEER is to become a voter once caught up (Kudu's
    PRE_VOTER, docs/design/tablet_copy.md#R7). Every new member joins as a non-voter; it is promoted
    if the request asks for a VOTER, or for a NON_VOTER with `promote` set. A NON_VOTER without
    `promote` (a read replica) stays a non-voter until an explicit PROMOTE_PEER; so does a peer
    whose member type is not given, unless `promote` is set."""
    if peer.member_type == mpb.VOTER:
        return True
    return bool(peer.promote)
