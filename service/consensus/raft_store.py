"""Durable state of one Raft node: the WAL, consensus metadata and the latest snapshot.

Theory of operation
-------------------
Three files (or file families) in the node's directory, each with one job:

  wal/            entries, the commit index (HARD_STATE records) and snapshot markers (wal.py)
  cmeta           term, vote, bootstrap config, peer addresses, own uuid (cmeta.py), replaced
                  atomically (write, fsync, rename, fsync dir) whenever term or vote changes
  snapshot        the latest state-machine snapshot (SnapshotPB + crc32c), replaced atomically

`persist(ready)` writes what a Ready asks for in the order that keeps every crash recoverable:
the snapshot file first, then its WAL marker; cmeta before the WAL sync (so a vote is durable
before the Ready's vote response is sent); entries and hard state to the WAL; one fdatasync
when `must_sync` (group commit: one Ready carries every proposal that arrived meanwhile).
Only after `persist` returns does the caller send the Ready's messages.

`persist` is `write` (everything but the final fdatasync) followed by `sync`. The asyncio shell
calls the two separately for a Ready that only appends WAL records (`writes_metadata` false, the
common case): it encodes and writes on its event loop, where the Python work is cheapest, and
runs only the fdatasync in a worker thread.

`open` rebuilds a `MemoryStorage` from those files. A snapshot marker in the WAL is written only
after the snapshot file is durable, so the file is never older than the marker; if a crash
fell between the two, the newer file wins and WAL entries that do not extend it are dropped.
The same code runs on a real disk and on the simulator's `SimFileSystem`.
"""

from __future__ import annotations

import posixpath
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import google_crc32c

from service.common.config import WalSettings
from service.consensus.cmeta import CmetaStore, ConsensusMetadata
from service.consensus.codec import snapshot_from_pb, snapshot_to_pb
from service.consensus.fs import FileSystem
from service.consensus.wal import Wal
from service.pb import consensus_pb2 as pb
from service.raft.storage import MemoryStorage
from service.raft.types import (
    NO_NODE,
    HardState,
    NodeId,
    RaftConfig,
    Ready,
    Snapshot,
)

_SNAP_HEADER = struct.Struct("<4sII")  # magic, crc32c(body), body length
_SNAP_MAGIC = b"TSNP"

_WAL = WalSettings()
"""`[wal]` with its defaults, those of `RaftStore.open` (servers pass their configured ones)."""


class StoreCorruption(Exception):
    """The node's durable state is inconsistent; it must not start (names the file)."""


class StoreIOError(Exception):
    """A write or fsync of cmeta or the snapshot failed. Like a WAL fsync failure, it is never
    retried: the node must stop and restart from what is really on disk."""


class WrongNode(Exception):
    """The data directory belongs to another node uuid."""


@dataclass(frozen=True, slots=True)
class Recovered:
    storage: MemoryStorage
    bootstrap_config: RaftConfig
    addresses: Mapping[str, str]
    applied_snapshot: Snapshot | None


class RaftStore:
    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        uuid: str,
        wal: Wal,
        cmeta: ConsensusMetadata,
        *,
        fsync: bool = _WAL.fsync,
    ) -> None:
        self.fs = fs
        self.directory = directory
        self.uuid = uuid
        self.wal = wal
        self.cmeta = cmeta
        self.fsync = fsync
        self._cmeta_store = CmetaStore(fs, posixpath.join(directory, "cmeta"))
        self._snapshot_path = posixpath.join(directory, "snapshot")
        self._failed: BaseException | None = None
        """Set by the first write or fsync failure: from then on every write is refused."""

    # -- opening --------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        fs: FileSystem,
        directory: str,
        uuid: str,
        *,
        bootstrap_config: RaftConfig | None = None,
        addresses: Mapping[str, str] | None = None,
        segment_bytes: int = _WAL.segment_size_bytes,
        preallocate: bool = _WAL.preallocate,
        fsync: bool = _WAL.fsync,
        on_wal_sync: Callable[[float], None] | None = None,
    ) -> tuple[RaftStore, Recovered]:
        """Open (or format) the node directory and rebuild its stable log.

        `bootstrap_config` and `addresses` are used only when formatting a new directory; an
        existing one keeps what it recorded (Kudu: the provided config is only a hint).
        `on_wal_sync` observes every WAL fdatasync's duration (`Wal.on_sync`)."""
        fs.makedirs(directory)
        cmeta_store = CmetaStore(fs, posixpath.join(directory, "cmeta"))
        cmeta = cmeta_store.load()
        if cmeta is None:
            cmeta = ConsensusMetadata(
                term=0,
                vote=NO_NODE,
                config=bootstrap_config or RaftConfig(frozenset()),
                addresses=dict(addresses or {}),
                uuid=uuid,
            )
            cmeta_store.save(cmeta)
        elif cmeta.uuid != uuid:
            raise WrongNode(
                f"{directory} holds the state of node {cmeta.uuid}, not {uuid}: refusing to start"
            )
        wal, contents = Wal.open(
            fs,
            posixpath.join(directory, "wal"),
            segment_bytes=segment_bytes,
            preallocate=preallocate,
            on_sync=on_wal_sync,
        )
        store = cls(fs, directory, uuid, wal, cmeta, fsync=fsync)
        snap = store._load_snapshot()
        marker = contents.snapshot
        if marker is not None and (snap is None or snap.meta.index < marker[0]):
            raise StoreCorruption(
                f"{store._snapshot_path}: WAL marks a snapshot at index {marker[0]} but the "
                f"snapshot file holds {snap.meta.index if snap else 'nothing'}"
            )
        storage = MemoryStorage()
        entries = contents.entries
        if snap is not None:
            storage.apply_snapshot(snap)
            idx, term = snap.meta.index, snap.meta.term
            if marker is None or marker[0] < idx:
                # Crash between the snapshot file and its marker: keep only entries that extend
                # the snapshot (log matching at its last index), as Raft's restore would.
                at = [e for e in entries if e.index == idx]
                entries = [e for e in entries if e.index > idx] if at and at[0].term == term else []
                # Roll the marker forward, so that the WAL's log is the one kept here (the
                # WAL drops the same entries): otherwise its next append would not connect.
                wal.mark_snapshot(idx, term)
                if fsync:
                    wal.sync()
            else:
                entries = [e for e in entries if e.index > idx]
        storage.append(entries)
        commit = contents.hard_state.commit
        floor = snap.meta.index if snap is not None else 0
        commit = max(floor, min(commit, storage.last_index()))
        storage.set_hard_state(HardState(cmeta.term, cmeta.vote, commit))
        return store, Recovered(storage, cmeta.config, cmeta.addresses, snap)

    def _load_snapshot(self) -> Snapshot | None:
        if not self.fs.exists(self._snapshot_path):
            return None
        raw = self.fs.read_bytes(self._snapshot_path)
        if len(raw) < _SNAP_HEADER.size:
            raise StoreCorruption(f"{self._snapshot_path}: truncated header ({len(raw)} bytes)")
        magic, crc, length = _SNAP_HEADER.unpack_from(raw)
        body = raw[_SNAP_HEADER.size :]
        if magic != _SNAP_MAGIC or length != len(body) or google_crc32c.value(body) != crc:
            raise StoreCorruption(f"{self._snapshot_path}: bad magic, length or checksum")
        msg = pb.SnapshotPB()
        msg.ParseFromString(body)
        return snapshot_from_pb(msg)

    # -- writing --------------------------------------------------------------------------------

    def save_snapshot(self, snap: Snapshot) -> None:
        """Make `snap` the durable snapshot, then mark it in the WAL (not synced here)."""
        self._check_usable()
        body = snapshot_to_pb(snap).SerializeToString()
        header = _SNAP_HEADER.pack(_SNAP_MAGIC, google_crc32c.value(body), len(body))
        try:
            self.fs.write_atomic(self._snapshot_path, header + body)
        except OSError as e:
            self._failed = e
            raise StoreIOError(f"{self._snapshot_path}: {e}") from e
        self.wal.mark_snapshot(snap.meta.index, snap.meta.term)

    def save_cmeta(self, **changes: object) -> None:
        self._check_usable()
        fields = {
            "term": self.cmeta.term,
            "vote": self.cmeta.vote,
            "config": self.cmeta.config,
            "addresses": dict(self.cmeta.addresses),
            "uuid": self.cmeta.uuid,
        }
        fields.update(changes)
        meta = ConsensusMetadata(**fields)  # type: ignore[arg-type]
        if meta != self.cmeta:
            try:
                self._cmeta_store.save(meta)
            except OSError as e:
                self._failed = e
                raise StoreIOError(f"{self._cmeta_store.path}: {e}") from e
            self.cmeta = meta

    def add_addresses(self, addresses: Mapping[str, str]) -> None:
        """Remember peer addresses (learned from config changes) across restarts."""
        if any(self.cmeta.addresses.get(k) != v for k, v in addresses.items()):
            self.save_cmeta(addresses={**self.cmeta.addresses, **addresses})

    def persist(self, rd: Ready) -> None:
        """Make a Ready's snapshot, hard state and entries durable (blocking; may run in a
        worker thread while nothing else touches this store): `write`, then `sync` if due."""
        if self.write(rd):
            self.wal.sync()

    def writes_metadata(self, rd: Ready) -> bool:
        """Whether persisting `rd` replaces a file besides the WAL: the snapshot, or cmeta for
        a new term or vote. Each is written atomically with fsyncs of its own, so such a Ready
        is persisted whole off the event loop; any other is WAL records only (`write` then
        `sync`)."""
        hs = rd.hard_state
        return rd.snapshot is not None or (
            hs is not None and (hs.term != self.cmeta.term or hs.vote != self.cmeta.vote)
        )

    def write(self, rd: Ready) -> bool:
        """Everything `persist` does except the WAL's final fdatasync; returns whether that
        fdatasync is due (the Ready must not be acknowledged or applied before it)."""
        self._check_usable()
        if rd.snapshot is not None:
            self.save_snapshot(rd.snapshot)
        hs = rd.hard_state
        if hs is not None and (hs.term != self.cmeta.term or hs.vote != self.cmeta.vote):
            self.save_cmeta(term=hs.term, vote=hs.vote)
        if rd.entries or hs is not None:
            self.wal.append(rd.entries, hs)
        return self.fsync and (rd.must_sync or rd.snapshot is not None)

    def sync(self) -> None:
        """The one fdatasync of a group commit: everything `write` wrote is durable after it.
        May run in a worker thread while nothing else touches this store."""
        self._check_usable()
        self.wal.sync()

    @staticmethod
    def apply_to_memory(storage: MemoryStorage, rd: Ready) -> None:
        """After `persist`: expose the now-durable state to the core through `storage`."""
        if rd.snapshot is not None:
            storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            storage.append(rd.entries)
        if rd.hard_state is not None:
            storage.set_hard_state(rd.hard_state)

    def compact(self, storage: MemoryStorage | None, snap: Snapshot, keep_entries: int) -> int:
        """After a local snapshot: drop log entries the snapshot covers, keeping
        `keep_entries` before it for followers that are slightly behind; returns the last
        index dropped. `storage` None: the caller drops them from the in-memory log itself
        (`compact_memory`), on the thread that reads it, while this runs in a worker."""
        self._check_usable()
        self.save_snapshot(snap)
        if self.fsync:
            self.wal.sync()
        upto = max(0, snap.meta.index - keep_entries)
        if storage is not None:
            self.compact_memory(storage, upto)
        self.wal.compact(upto)
        return upto

    @staticmethod
    def compact_memory(storage: MemoryStorage, upto: int) -> None:
        if upto > storage.first_index() - 1:
            storage.compact(upto)

    def close(self) -> None:
        self.wal.close()

    def _check_usable(self) -> None:
        """Never retry after a failed write or fsync (of cmeta, the snapshot or the WAL): the
        node must restart from what is really on disk."""
        if self._failed is not None or self.wal.failed:
            cause = self._failed or "a WAL write or fsync failed"
            raise StoreIOError(
                f"{self.directory}: refusing writes after an earlier I/O error ({cause}); "
                "the node must restart"
            ) from self._failed

    def node_id(self) -> NodeId:
        return NodeId(self.uuid)
