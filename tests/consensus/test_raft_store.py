"""RaftStore: format and reopen, crash safety of votes and snapshots, corruption, I/O failures.

Crash tests run on the simulated disk (`SimFileSystem.crash` with a seeded `random.Random`), the
rest on a real directory under tmp_path as well.
"""

from __future__ import annotations

import copy
import os
import posixpath
import random
from pathlib import Path

import pytest

from service.consensus.fs import FileSystem, RealFileSystem
from service.consensus.raft_store import (
    RaftStore,
    Recovered,
    StoreCorruption,
    StoreIOError,
    WrongNode,
)
from service.consensus.wal import Wal, WalIOError
from service.raft.storage import MemoryStorage
from service.raft.types import (
    NO_NODE,
    Entry,
    EntryType,
    HardState,
    NodeId,
    RaftConfig,
    Ready,
    Snapshot,
    SnapshotMeta,
)
from service.testing.simdisk import SimFileSystem

A, B, C = NodeId("uuid-a"), NodeId("uuid-b"), NodeId("uuid-c")
CONFIG = RaftConfig(frozenset({A, B, C}))
ADDRS: dict[str, str] = {A: "10.0.0.1:7051", B: "10.0.0.2:7051", C: "10.0.0.3:7051"}
SIM_DIR = "/data/raft"


def ents(first: int, last: int, term: int = 1, size: int = 16) -> list[Entry]:
    return [Entry(term, i, data=bytes([i % 251]) * size) for i in range(first, last + 1)]


def open_store(
    fs: FileSystem, directory: str, uuid: str = A, **kw: object
) -> tuple[RaftStore, Recovered]:
    kw.setdefault("segment_bytes", 1 << 16)
    return RaftStore.open(fs, directory, uuid, **kw)  # type: ignore[arg-type]


def write(store: RaftStore, storage: MemoryStorage, rd: Ready) -> None:
    """What the node does with a Ready: persist, then expose to the core."""
    store.persist(rd)
    RaftStore.apply_to_memory(storage, rd)


def put(store: RaftStore, storage: MemoryStorage, entries: list[Entry], hs: HardState) -> None:
    """Persist a Ready of entries and hard state with an fsync (the common case)."""
    write(store, storage, Ready(entries=entries, hard_state=hs, must_sync=True))


def log_of(storage: MemoryStorage) -> list[Entry]:
    return storage.entries(storage.first_index(), storage.last_index() + 1)


@pytest.fixture(params=["sim", "real"])
def disk(request: pytest.FixtureRequest) -> tuple[FileSystem, str]:
    if request.param == "sim":
        return SimFileSystem(), SIM_DIR
    return RealFileSystem(), os.path.join(str(request.getfixturevalue("tmp_path")), "raft")


# --- format and reopen ----------------------------------------------------------------------------


def test_format_then_reopen_keeps_term_vote_entries_and_commit(
    disk: tuple[FileSystem, str],
) -> None:
    fs, d = disk
    store, rec = open_store(fs, d, bootstrap_config=CONFIG, addresses=ADDRS)
    assert rec.bootstrap_config == CONFIG
    assert dict(rec.addresses) == ADDRS
    assert rec.applied_snapshot is None
    assert rec.storage.hard_state == HardState()
    assert rec.storage.last_index() == 0

    batch = [Entry(1, 1), Entry(1, 2, EntryType.CONFIG, b"{}"), *ents(3, 5, term=2)]
    put(store, rec.storage, batch, HardState(2, B, 4))
    store.close()

    # Another bootstrap config on reopen is only a hint: the recorded one wins.
    store, rec = open_store(
        fs, d, bootstrap_config=RaftConfig(frozenset({A})), addresses={A: "elsewhere:1"}
    )
    assert rec.bootstrap_config == CONFIG
    assert dict(rec.addresses) == ADDRS
    assert rec.storage.hard_state == HardState(2, B, 4)
    assert log_of(rec.storage) == batch
    assert store.cmeta.term == 2 and store.cmeta.vote == B
    store.close()


def test_commit_is_clamped_to_the_log_on_reopen(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    store, rec = open_store(fs, d, bootstrap_config=CONFIG)
    put(store, rec.storage, ents(1, 3), HardState(1, A, 3))
    store.close()
    _, rec = open_store(fs, d)
    assert rec.storage.hard_state.commit == 3
    assert rec.storage.last_index() == 3


def test_directory_of_another_uuid_is_refused(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    store, _ = open_store(fs, d, uuid=A, bootstrap_config=CONFIG)
    store.close()
    with pytest.raises(WrongNode, match="holds the state of node uuid-a, not uuid-b"):
        open_store(fs, d, uuid=B)
    store, _ = open_store(fs, d, uuid=A)  # still the rightful owner's
    store.close()


def test_addresses_learned_later_survive_a_restart(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    store, _ = open_store(fs, d, bootstrap_config=CONFIG, addresses=ADDRS)
    store.add_addresses({"uuid-d": "10.0.0.4:7051"})
    store.close()
    _, rec = open_store(fs, d)
    assert dict(rec.addresses) == {**ADDRS, "uuid-d": "10.0.0.4:7051"}


# --- votes survive crashes ------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_vote_survives_a_crash_right_after_persist(seed: int) -> None:
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG)
    write(store, rec.storage, Ready(hard_state=HardState(term=2, vote=B), must_sync=True))
    fs.crash(random.Random(seed))
    _, rec = open_store(fs, SIM_DIR)
    assert rec.storage.hard_state.term == 2
    assert rec.storage.hard_state.vote == B


@pytest.mark.parametrize("seed", range(4))
def test_vote_is_durable_before_the_wal_is_synced(seed: int) -> None:
    """cmeta is written (atomically, durably) before the WAL sync: even when that sync fails,
    the vote the Ready carries is on disk, so a vote response can never outlive it."""
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG, preallocate=False)
    fs.fail_next_sync("/wal/")
    with pytest.raises(WalIOError):
        store.persist(Ready(entries=ents(1, 2, term=3), hard_state=HardState(3, C), must_sync=True))
    fs.crash(random.Random(seed))
    _, rec = open_store(fs, SIM_DIR)
    assert (rec.storage.hard_state.term, rec.storage.hard_state.vote) == (3, C)


@pytest.mark.parametrize("seed", range(8))
def test_synced_entries_and_commit_survive_a_crash(seed: int) -> None:
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG, preallocate=False)
    put(store, rec.storage, ents(1, 10), HardState(1, A, 6))
    # Unsynced afterwards: a commit-only Ready (buffered) may or may not survive.
    write(store, rec.storage, Ready(hard_state=HardState(1, A, 10)))
    fs.crash(random.Random(seed))
    _, rec = open_store(fs, SIM_DIR)
    assert log_of(rec.storage) == ents(1, 10)
    assert rec.storage.hard_state.commit in (6, 10)
    assert rec.storage.hard_state.vote == A


# --- snapshots ------------------------------------------------------------------------------------


def test_snapshot_and_compaction_survive_a_restart(tmp_path: Path) -> None:
    fs, d = RealFileSystem(), str(tmp_path / "raft")
    store, rec = open_store(fs, d, bootstrap_config=CONFIG, segment_bytes=2048, preallocate=False)
    storage = rec.storage
    for first in range(1, 101, 10):
        rd = Ready(entries=ents(first, first + 9, size=64), hard_state=HardState(1, A, first + 9))
        rd.must_sync = True
        write(store, storage, rd)
    segments_before = len(store.wal.segments())
    assert segments_before > 3

    snap = storage.create_snapshot(80, CONFIG, b"state machine at 80")
    store.compact(storage, snap, keep_entries=10)
    assert storage.first_index() == 71  # in memory: 10 entries kept for slow followers
    assert len(store.wal.segments()) < segments_before  # whole segments up to 70 deleted
    assert all(
        s.last_index is None or s.last_index > 70 or s is store.wal.segments()[-1]
        for s in store.wal.segments()
    )
    store.close()

    store, rec = open_store(fs, d, segment_bytes=2048, preallocate=False)
    assert rec.applied_snapshot == snap
    assert rec.storage.snapshot() == snap
    assert log_of(rec.storage) == ents(81, 100, size=64)  # only entries after the snapshot
    assert rec.storage.hard_state.commit == 100
    # And it keeps working: append after the snapshot, restart again.
    put(store, rec.storage, ents(101, 101), HardState(1, A, 101))
    store.close()
    _, rec = open_store(fs, d, segment_bytes=2048, preallocate=False)
    assert rec.applied_snapshot == snap
    assert log_of(rec.storage) == [*ents(81, 100, size=64), *ents(101, 101)]


def _crashed_in_snapshot_window(
    seed: int, log: list[Entry], commit: int, snap: Snapshot
) -> tuple[SimFileSystem, tuple[int, int] | None]:
    """Write `log` durably, then save `snap` (file durable, WAL marker written but not synced)
    and lose power. Returns the disk and the marker the WAL holds after the crash."""
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG, preallocate=False)
    put(store, rec.storage, log, HardState(1, A, commit))
    store.save_snapshot(snap)  # the file is durable once this returns; the marker is not
    assert fs.durable_bytes(posixpath.join(SIM_DIR, "snapshot"))
    fs.crash(random.Random(seed))
    probe = copy.deepcopy(fs)  # look at the WAL without touching the disk under test
    _, contents = Wal.open(probe, posixpath.join(SIM_DIR, "wal"))
    return fs, contents.snapshot


def test_crash_between_local_snapshot_file_and_its_marker() -> None:
    snap = Snapshot(SnapshotMeta(8, 1, CONFIG), b"state at 8")
    markers = set()
    for seed in range(12):
        fs, marker = _crashed_in_snapshot_window(seed, ents(1, 10), 10, snap)
        markers.add(marker)
        store, rec = open_store(fs, SIM_DIR)
        # Either side of the window reopens to the same state: the newer file wins and the
        # entries that extend it are kept.
        assert rec.applied_snapshot == snap
        assert log_of(rec.storage) == ents(9, 10)
        assert rec.storage.hard_state.commit == 10
        # It keeps working, and a second restart agrees.
        put(store, rec.storage, ents(11, 12), HardState(1, A, 12))
        store.close()
        _, rec = open_store(fs, SIM_DIR)
        assert rec.applied_snapshot == snap
        assert log_of(rec.storage) == ents(9, 12)
    assert None in markers  # the crash did fall inside the window for some seeds


def test_crash_between_installed_snapshot_file_and_its_marker() -> None:
    """A snapshot from the leader that the local log does not contain (Raft's restore): after
    the crash the old log must not come back, and appends after the snapshot must work."""
    snap = Snapshot(SnapshotMeta(20, 3, CONFIG), b"leader state at 20")
    markers = set()
    for seed in range(12):
        fs, marker = _crashed_in_snapshot_window(seed, ents(1, 5), 3, snap)
        markers.add(marker)
        store, rec = open_store(fs, SIM_DIR)
        assert rec.applied_snapshot == snap
        assert rec.storage.first_index() == 21 and rec.storage.last_index() == 20
        assert rec.storage.hard_state.commit == 20
        put(store, rec.storage, ents(21, 22, term=3), HardState(3, NO_NODE, 22))
        store.close()
        _, rec = open_store(fs, SIM_DIR)
        assert rec.applied_snapshot == snap
        assert log_of(rec.storage) == ents(21, 22, term=3)
        assert rec.storage.hard_state.commit == 22
    assert None in markers


def test_installed_snapshot_through_persist_replaces_the_log(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    store, rec = open_store(fs, d, bootstrap_config=CONFIG)
    put(store, rec.storage, ents(1, 5), HardState(1, A, 3))
    snap = Snapshot(SnapshotMeta(20, 3, CONFIG), b"from the leader")
    write(
        store,
        rec.storage,
        Ready(snapshot=snap, hard_state=HardState(3, NO_NODE, 20), must_sync=True),
    )
    store.close()
    _, rec = open_store(fs, d)
    assert rec.applied_snapshot == snap
    assert rec.storage.last_index() == 20 and rec.storage.first_index() == 21
    assert rec.storage.hard_state == HardState(3, NO_NODE, 20)


# --- corruption -----------------------------------------------------------------------------------


def _store_with_snapshot(fs: FileSystem, d: str) -> str:
    store, rec = open_store(fs, d, bootstrap_config=CONFIG)
    put(store, rec.storage, ents(1, 10), HardState(1, A, 10))
    snap = rec.storage.create_snapshot(10, CONFIG, b"some state" * 10)
    store.compact(rec.storage, snap, keep_entries=0)
    store.close()
    return posixpath.join(d, "snapshot")


def _overwrite(fs: FileSystem, path: str, data: bytes) -> None:
    """Replace a file's content outright (bit rot or a truncation, as a test sets it up)."""
    fs.write_atomic(path, data)


@pytest.mark.parametrize("damage", ["flip-body", "flip-magic", "truncate-body", "truncate-header"])
def test_corrupted_snapshot_file_is_refused_naming_it(
    disk: tuple[FileSystem, str], damage: str
) -> None:
    fs, d = disk
    path = _store_with_snapshot(fs, d)
    raw = bytearray(fs.read_bytes(path))
    if damage == "flip-body":
        raw[-3] ^= 0x40
    elif damage == "flip-magic":
        raw[0] ^= 0x01
    elif damage == "truncate-body":
        del raw[-5:]
    else:
        del raw[5:]
    _overwrite(fs, path, bytes(raw))
    with pytest.raises(StoreCorruption) as ei:
        open_store(fs, d)
    assert path in str(ei.value)


def test_snapshot_file_missing_under_a_wal_marker_is_corruption(
    disk: tuple[FileSystem, str],
) -> None:
    fs, d = disk
    path = _store_with_snapshot(fs, d)
    fs.remove(path)
    fs.fsync_dir(d)
    with pytest.raises(StoreCorruption, match="WAL marks a snapshot at index 10"):
        open_store(fs, d)


def test_snapshot_file_older_than_the_wal_marker_is_corruption(
    disk: tuple[FileSystem, str],
) -> None:
    fs, d = disk
    path = _store_with_snapshot(fs, d)
    old = fs.read_bytes(path)
    store, rec = open_store(fs, d)
    put(store, rec.storage, ents(11, 20), HardState(1, A, 20))
    store.compact(rec.storage, rec.storage.create_snapshot(20, CONFIG, b"newer"), keep_entries=0)
    store.close()
    _overwrite(fs, path, old)  # the snapshot at 10 is back, the WAL says 20
    with pytest.raises(StoreCorruption, match="holds 10"):
        open_store(fs, d)


# --- I/O failures ---------------------------------------------------------------------------------


def test_wal_sync_failure_stops_the_store_for_good() -> None:
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG)
    put(store, rec.storage, ents(1, 3), HardState(1, A, 3))
    fs.fail_next_sync("/wal/")
    with pytest.raises(WalIOError):
        store.persist(Ready(entries=ents(4, 5), must_sync=True))
    # Never retried: every later write is refused, including one that would only touch cmeta
    # or the snapshot file.
    with pytest.raises((WalIOError, StoreIOError)):
        store.persist(Ready(entries=ents(4, 5), must_sync=True))
    with pytest.raises((WalIOError, StoreIOError)):
        store.persist(Ready(hard_state=HardState(2, B, 3), must_sync=True))
    with pytest.raises((WalIOError, StoreIOError)):
        store.save_snapshot(Snapshot(SnapshotMeta(3, 1, CONFIG), b"s"))
    assert store.cmeta.term == 1
    store.close()
    # What is really on disk comes back on restart.
    _, rec = open_store(fs, SIM_DIR)
    assert rec.storage.last_index() in (3, 5)
    assert rec.storage.hard_state.term == 1


@pytest.mark.parametrize("target", ["cmeta", "snapshot"])
def test_cmeta_or_snapshot_write_failure_stops_the_store_for_good(target: str) -> None:
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG)
    put(store, rec.storage, ents(1, 3), HardState(1, A, 3))
    fs.fail_next_sync(posixpath.join(SIM_DIR, target))
    if target == "cmeta":
        failing = Ready(hard_state=HardState(2, B, 3), must_sync=True)
    else:
        failing = Ready(snapshot=Snapshot(SnapshotMeta(9, 2, CONFIG), b"s"), must_sync=True)
    with pytest.raises(StoreIOError, match=target):
        store.persist(failing)
    assert store.cmeta.term == 1
    # The same Ready again would now succeed on this disk: the store must refuse it anyway.
    with pytest.raises((StoreIOError, WalIOError)):
        store.persist(failing)
    with pytest.raises((StoreIOError, WalIOError)):
        store.persist(Ready(entries=ents(4, 4), must_sync=True))
    with pytest.raises((StoreIOError, WalIOError)):
        store.compact(rec.storage, rec.storage.create_snapshot(3, CONFIG, b"s"), keep_entries=0)
    assert store.cmeta.term == 1
    store.close()
    _, rec = open_store(fs, SIM_DIR)
    assert rec.storage.hard_state == HardState(1, A, 3)
    assert rec.applied_snapshot is None
    assert log_of(rec.storage) == ents(1, 3)


# --- write and sync apart (the asyncio shell's pipelined persist) --------------------------------


def test_writes_metadata_only_for_a_snapshot_or_a_new_term_or_vote() -> None:
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG)
    put(store, rec.storage, ents(1, 2), HardState(1, A, 1))
    assert not store.writes_metadata(Ready(entries=ents(3, 4), must_sync=True))
    assert not store.writes_metadata(Ready(hard_state=HardState(1, A, 2)))  # commit only
    assert store.writes_metadata(Ready(hard_state=HardState(2, A, 2), must_sync=True))
    assert store.writes_metadata(Ready(hard_state=HardState(1, B, 2), must_sync=True))
    snap = Snapshot(SnapshotMeta(2, 1, CONFIG), b"s")
    assert store.writes_metadata(Ready(snapshot=snap, must_sync=True))
    store.close()


@pytest.mark.parametrize("seed", range(4))
def test_write_then_sync_is_persist_in_two_steps(seed: int) -> None:
    fs = SimFileSystem()
    store, rec = open_store(fs, SIM_DIR, bootstrap_config=CONFIG, preallocate=False)
    put(store, rec.storage, ents(1, 3), HardState(1, A, 2))
    syncs = store.wal.metrics.syncs
    rd = Ready(entries=ents(4, 6), hard_state=HardState(1, A, 3), must_sync=True)
    assert store.write(rd) is True  # an fdatasync is due
    assert store.wal.metrics.syncs == syncs  # ... and not done by write()
    assert store.write(Ready(hard_state=HardState(1, A, 4))) is False  # commit only: buffered
    store.sync()
    assert store.wal.metrics.syncs == syncs + 1
    fs.crash(random.Random(seed))
    _, rec = open_store(fs, SIM_DIR)
    assert log_of(rec.storage) == ents(1, 6)
    assert rec.storage.hard_state.commit == 4


def test_write_without_fsync_never_asks_for_a_sync() -> None:
    fs = SimFileSystem()
    store, _ = open_store(fs, SIM_DIR, bootstrap_config=CONFIG, fsync=False)
    assert store.write(Ready(entries=ents(1, 2), must_sync=True)) is False
    store.close()
