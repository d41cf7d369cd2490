"""One tablet replica: its Raft group, its rows, and the state machine between them.

Theory of operation
-------------------
A replica is a `RaftNode` (group id = tablet id) whose state machine is the tablet's `RowStore`.
Every change to rows or schema is a Raft entry; the first byte says which:

  b"W" + WriteBatch.encode()   a batch of row operations, validated by the leader BEFORE it is
                               proposed (bad input never reaches the log); per-row outcomes
                               (duplicate key, missing key) are decided at apply, identically on
                               every replica
  b"A" + AlterSchemaRequestPB  a new schema (and table name), applied in log order, so a write
                               proposed under the old schema is applied under the schema that
                               precedes it in the log

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pyarrow as pa

from service.common.errors import (
    Corruption,
    FailedPrecondition,
    InvalidArgument,
    IOFatal,
    NotTheLeader,
    TabletNotRunning,
    TesseraError,
)
from service.common.predicates import ScanSpec
from service.common.schema import Schema
from service.common.schema_codec import schema_from_pb, schema_to_pb
from service.consensus.fs import RealFileSystem
from service.consensus.node import LeaderChange, NodeSettings, RaftNode, Sender
from service.consensus.raft_store import RaftStore
from service.pb import master_pb2 as mpb
from service.pb import tserver_pb2 as tpb
from service.raft import ConfigChangeType, NodeId, RaftConfig, Role
from service.tserver import superblock as sbmod
from service.tserver.row_ops import WriteBatch, check_write_size, decode_write
from service.tserver.rowstore import AppliedWrite, RowStore
from service.tserver.superblock import DataState, Superblock

log = logging.getLogger(__name__)

_WRITE = b"W"
_ALTER = b"A"
_SNAP_INDEX = struct.Struct("<Q")


def write_entry(batch: WriteBatch) -> bytes:
    """The Raft entry of a validated write (module docstring)."""
    return _WRITE + batch.encode()


def _validated_entry(schema: Schema, rows: bytes, default_op: int, ops: list[int]) -> bytes | None:
    """The Raft entry of a client write checked under `schema` (InvalidArgument if it is bad,
    or larger than a Write may be); None if it has no rows. Pure: it may run in a thread."""
    check_write_size(len(rows))
    batch = decode_write(schema, rows, default_op, ops)
    check_write_size(len(rows), batch.num_rows)
    if batch.table.num_rows == 0:
        return None
    return write_entry(batch)


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


@dataclass(frozen=True)
class TabletSettings:
    node: NodeSettings
    wal_segment_bytes: int = 8 << 20
    wal_preallocate: bool = True
    fsync: bool = True
    flush_rows: int = 100_000
    """Converting the in-memory store to Arrow holds the GIL (about 0.2 s per 100k rows):
    small flushes keep every other tablet's Raft loop responsive."""
    flush_bytes: int = 64 << 20
    compact_files: int = 4
    flush_idle_s: float = 10.0
    """A memstore that has taken no write for this long is flushed, and files whose key ranges
    overlap are then compacted, so a tablet that went cold is read from sorted files without
    merging (and its WAL replay is short). 0: never."""
    on_wal_sync: Callable[[float], None] | None = field(default=None, compare=False)
    """Observes every WAL fdatasync of every replica (the server's fsync histogram)."""
    on_rows_written: Callable[[int], None] | None = field(default=None, compare=False)
    """Told the rows each Write applied on this replica as leader (the server's counter)."""


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
        if kind == _WRITE:
            result = store.apply_write(index, WriteBatch.decode(body, store.schema))
            r.after_apply()
            return result
        if kind == _ALTER:
            req = tpb.AlterSchemaRequestPB.FromString(body)
            schema = schema_from_pb(req.schema)
            if schema.version > store.schema.version:
                store.alter_schema(index, schema)
            else:
                store.note_index(index)
            if req.new_table_name and req.new_table_name != r.superblock.table_name:
                r.rename_table(req.new_table_name)
            r.changed()
            return store.schema.version
        raise InvalidArgument(f"tablet {r.tablet_id}: unknown entry kind {kind!r} at {index}")

    def durable_index(self) -> int:
        """The row store's flushed index: the Raft log is kept from there on (its anchor)."""
        store = self.replica.store
        return store.flushed_index if store is not None else 0

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
        self._last_apply = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None

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
        refused by the failed store, or the stopped Raft loop, is its consequence)."""
        if self.state is ReplicaState.FAILED:
            return
        log.error("tablet %s failed: %s", self.tablet_id, e)
        self.state = ReplicaState.FAILED
        self.error = e if isinstance(e, TesseraError) else IOFatal(f"{type(e).__name__}: {e}")
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
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

    async def write(self, req: tpb.WriteRequestPB, timeout: float) -> tpb.WriteResponsePB:
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
        # Validating and encoding cost time linear in the request (up to MAX_WRITE_BYTES of
        # row_ops.py), mostly in Arrow calls that release the GIL (full validation, casts, the
        # IPC writer): a worker thread keeps them off the loop that every Raft group of this
        # server shares (service/common/loop_lag.py).
        entry = await asyncio.to_thread(
            _validated_entry, store.schema, req.rows, int(req.default_op), list(req.ops)
        )
        if entry is None:
            return tpb.WriteResponsePB(applied_index=node.applied)
        result = cast(AppliedWrite, await node.propose(entry, timeout=timeout))
        if self.settings.on_rows_written is not None:
            self.settings.on_rows_written(result.rows_applied)
        resp = tpb.WriteResponsePB(applied_index=node.applied, rows_applied=result.rows_applied)
        for row, err in result.errors:
            resp.per_row_errors.add(
                row_index=row, error=mpb.ErrorPB(code=err.code, message=str(err))
            )
        return resp

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

    def after_apply(self) -> None:
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
            if not compact:
                return
            files = sum(1 for f in store.data_files() if f.endswith(".arrow"))
            overlapping = files <= self.settings.compact_files
            if overlapping and not idle:
                return
            while store is self.store:
                c = store.prepare_compaction(overlapping=overlapping)
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
