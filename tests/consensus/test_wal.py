"""The WAL: round trips, overwrites, segments, compaction, torn tails, corruption, fsync failure."""

from __future__ import annotations

import errno
import os
import random
import struct
from dataclasses import dataclass, field

import pytest

from service.consensus.fs import AppendFile, FileSystem, RealFileSystem
from service.consensus.wal import (
    SEGMENT_HEADER_SIZE,
    Wal,
    WalContents,
    WalCorruption,
    WalIOError,
    segment_name,
)
from service.raft.types import EMPTY_HARD_STATE, Entry, EntryType, HardState, NodeId
from service.testing.simdisk import SimFileSystem

WAL_DIR = "/node/wal"
SEG = 1 << 16  # small segments: real-disk tests should not reserve 64 MiB per open
ENTRY_RECORD_OVERHEAD = 8 + 18  # record head + entry head


def ents(first: int, last: int, term: int = 1, size: int = 8) -> list[Entry]:
    return [Entry(term, i, data=bytes([i % 251]) * size) for i in range(first, last + 1)]


@pytest.fixture(params=["sim", "real"])
def disk(request: pytest.FixtureRequest) -> tuple[FileSystem, str]:
    """The same test on the simulated disk and on a real one under tmp_path."""
    if request.param == "sim":
        return SimFileSystem(), WAL_DIR
    return RealFileSystem(), os.path.join(str(request.getfixturevalue("tmp_path")), "wal")


# --- round trips ---------------------------------------------------------------------------------


def test_empty_wal(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, c = Wal.open(fs, d, segment_bytes=4096)
    assert c == WalContents(None, EMPTY_HARD_STATE, [])
    assert wal.last_index == 0
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=4096)
    assert c == WalContents(None, EMPTY_HARD_STATE, [])


def test_round_trip_entries_hard_state_and_marker(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=1 << 20)
    batch = [
        Entry(1, 1),  # the leader's no-op
        Entry(1, 2, EntryType.CONFIG, b'{"cfg": 1}'),
        Entry(2, 3, EntryType.NORMAL, b"\x00\xff" * 100),
    ]
    hs = HardState(term=2, vote=NodeId("node-\u00e9"), commit=2)
    wal.append(batch, hs)
    wal.sync()
    assert wal.last_index == 3
    wal.close()
    wal, c = Wal.open(fs, d, segment_bytes=1 << 20)
    assert c.entries == batch
    assert c.hard_state == hs
    assert c.snapshot is None
    assert wal.term_at(3) == 2
    wal.append(ents(4, 6, term=2))
    wal.mark_snapshot(3, 2)
    wal.sync()
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=1 << 20)
    assert c.snapshot == (3, 2)
    assert c.hard_state == hs
    assert c.entries == ents(4, 6, term=2)


def test_latest_hard_state_wins(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=SEG)
    for t in range(1, 6):
        wal.append(hard_state=HardState(t, NodeId(f"n{t}"), 0))
    wal.sync()
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=SEG)
    assert c.hard_state == HardState(5, NodeId("n5"), 0)


def test_overwrite_truncates_the_suffix(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=512)
    wal.append(ents(1, 10, term=1))
    wal.sync()
    wal.append(ents(6, 8, term=2))  # a new leader overwrites the uncommitted tail
    assert wal.last_index == 8
    assert wal.term_at(6) == 2 and wal.term_at(5) == 1 and wal.term_at(9) is None
    wal.sync()
    wal.close()
    wal, c = Wal.open(fs, d, segment_bytes=512)
    assert c.entries == ents(1, 5, term=1) + ents(6, 8, term=2)
    wal.append(ents(3, 4, term=3))  # again, now across segments
    wal.close()  # close syncs
    _, c = Wal.open(fs, d, segment_bytes=512)
    assert c.entries == ents(1, 2, term=1) + ents(3, 4, term=3)


def test_append_rejects_caller_bugs_without_writing(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=SEG)
    wal.append(ents(1, 5, term=2), HardState(2, NodeId("a"), 3))
    bad: list[list[Entry]] = [
        ents(7, 8, term=2),  # gap
        [Entry(2, 6), Entry(2, 8)],  # not consecutive
        ents(6, 6, term=1),  # term below its predecessor
        [Entry(3, 6), Entry(2, 7)],  # term goes down within the batch
        ents(3, 4, term=3),  # overwrites a committed entry
    ]
    for batch in bad:
        with pytest.raises(ValueError):
            wal.append(batch)
    wal.mark_snapshot(2, 2)
    with pytest.raises(ValueError):
        wal.mark_snapshot(1, 2)  # markers never go back
    with pytest.raises(ValueError):
        wal.mark_snapshot(2, 3)  # same index, other term
    wal.close()
    wal, c = Wal.open(fs, d, segment_bytes=SEG)
    assert c.entries == ents(3, 5, term=2)
    with pytest.raises(ValueError):
        wal.append(ents(2, 2, term=2))  # at the snapshot index
    with pytest.raises(ValueError):
        wal.compact(3)  # beyond the marker


def test_snapshot_marker_matching_the_log_keeps_the_suffix(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=SEG)
    wal.append(ents(1, 10, term=1))
    wal.mark_snapshot(5, 1)
    assert wal.last_index == 10
    wal.append(ents(11, 12, term=1))
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=SEG)
    assert c.snapshot == (5, 1)
    assert c.entries == ents(6, 12, term=1)


@pytest.mark.parametrize(("index", "term"), [(5, 2), (20, 3)])
def test_installed_snapshot_not_matching_the_log_resets_it(
    disk: tuple[FileSystem, str], index: int, term: int
) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=SEG)
    wal.append(ents(1, 10, term=1))
    wal.mark_snapshot(index, term)
    assert wal.last_index == index
    with pytest.raises(ValueError):
        wal.append(ents(index + 2, index + 2, term=term))  # must continue right after it
    wal.close()
    wal, c = Wal.open(fs, d, segment_bytes=SEG)
    assert c.snapshot == (index, term)
    assert c.entries == []
    assert wal.last_index == index
    wal.append(ents(index + 1, index + 3, term=term))
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=SEG)
    assert c.entries == ents(index + 1, index + 3, term=term)


# --- segments and compaction ---------------------------------------------------------------------


@pytest.mark.parametrize("preallocate", [True, False])
def test_rollover_creates_finished_segments(
    disk: tuple[FileSystem, str], preallocate: bool
) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=1024, preallocate=preallocate)
    for i in range(1, 201, 5):
        wal.append(ents(i, i + 4, size=40), HardState(1, NodeId("a"), i))
        wal.sync()
    segs = wal.segments()
    assert len(segs) > 5
    assert [s.seq for s in segs] == list(range(1, len(segs) + 1))
    for s in segs[:-1]:
        # Finished segments hold just their records: preallocated space was truncated.
        assert len(fs.read_bytes(s.path)) == s.size
        assert s.size >= 1024
    assert segs[0].first_index == 1 and segs[-1].last_index == 200
    assert wal.metrics.syncs == 40
    wal.close()
    wal, c = Wal.open(fs, d, segment_bytes=1024, preallocate=preallocate)
    assert c.entries == ents(1, 200, size=40)
    assert c.hard_state == HardState(1, NodeId("a"), 196)
    assert len(wal.segments()) == len(segs) + 1  # every open starts a new segment


def test_compaction_deletes_covered_segments_and_keeps_state(
    disk: tuple[FileSystem, str],
) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=1024)
    hs = HardState(7, NodeId("voted-once"), 0)
    wal.append(hard_state=hs)  # written once, long before the segments it must outlive
    for i in range(1, 301, 10):
        wal.append(ents(i, i + 9, term=7, size=30))
        wal.sync()
    wal.mark_snapshot(150, 7)
    before = wal.segments()
    deleted = wal.compact(150)
    assert deleted > 0
    after = wal.segments()
    assert after == before[deleted:]
    assert all(s.last_index is not None and s.last_index <= 150 for s in before[:deleted])
    assert after[0].last_index is not None and after[0].last_index > 150
    for s in before[:deleted]:
        assert not fs.exists(s.path)
    assert wal.compact(150) == 0
    wal.close()
    wal, c = Wal.open(fs, d, segment_bytes=1024)
    assert c.hard_state == hs
    assert c.snapshot == (150, 7)
    assert c.entries == ents(151, 300, term=7, size=30)
    # Compacting everything but the active segment still leaves hard state and marker.
    wal.append(ents(301, 310, term=7))
    wal.mark_snapshot(310, 7)
    wal.compact(310)
    assert len(wal.segments()) == 1
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=1024)
    assert (c.hard_state, c.snapshot, c.entries) == (hs, (310, 7), [])


def test_compaction_keeps_a_segment_prefix_only(disk: tuple[FileSystem, str]) -> None:
    """An older segment with high indexes pins later ones that overwrote part of it."""
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=512)
    wal.append(ents(1, 40, term=1, size=20))
    wal.sync()  # one big segment: 1..40
    wal.append(ents(20, 30, term=2, size=20))
    wal.sync()
    wal.append(ents(31, 31, term=2))
    wal.sync()
    wal.mark_snapshot(30, 2)
    assert wal.compact(30) == 0  # the first segment reaches 40 > 30: nothing may go
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=512)
    assert c.entries == [Entry(2, 31, data=bytes([31]) * 8)]


def test_compaction_after_a_reset_does_not_resurrect_stale_entries(
    disk: tuple[FileSystem, str],
) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=512)
    for i in range(1, 101, 10):
        wal.append(ents(i, i + 9, term=1, size=30))
        wal.sync()
    # The leader installs a snapshot at 50 whose term our log does not have.
    wal.mark_snapshot(50, 3)
    deleted = wal.compact(50)
    assert deleted > 0
    wal.close()
    _, c = Wal.open(fs, d, segment_bytes=512)
    assert c.snapshot == (50, 3)
    assert c.entries == []


# --- crashes: torn tails -------------------------------------------------------------------------


@dataclass
class Model:
    """What the log must look like: the state after each record written since the last sync."""

    entries: list[Entry] = field(default_factory=list)
    hard_state: HardState = EMPTY_HARD_STATE
    snapshot: tuple[int, int] | None = None
    acceptable: list[tuple[tuple[Entry, ...], HardState, tuple[int, int] | None]] = field(
        default_factory=list
    )

    def state(self) -> tuple[tuple[Entry, ...], HardState, tuple[int, int] | None]:
        return tuple(self.entries), self.hard_state, self.snapshot

    def synced(self) -> None:
        self.acceptable = [self.state()]

    def last_index(self) -> int:
        if self.entries:
            return self.entries[-1].index
        return self.snapshot[0] if self.snapshot else 0

    def term_at(self, index: int) -> int | None:
        if self.snapshot and index == self.snapshot[0]:
            return self.snapshot[1]
        for e in self.entries:
            if e.index == index:
                return e.term
        return None

    def append(self, batch: list[Entry], hs: HardState | None) -> None:
        for e in batch:
            self.entries = [x for x in self.entries if x.index < e.index] + [e]
            self.acceptable.append(self.state())
        if hs is not None:
            self.hard_state = hs
            self.acceptable.append(self.state())

    def mark(self, index: int, term: int) -> None:
        if self.term_at(index) == term:
            self.entries = [e for e in self.entries if e.index > index]
        else:
            self.entries = []
        self.snapshot = (index, term)
        self.acceptable.append(self.state())


def random_workload(wal: Wal, model: Model, rng: random.Random, steps: int) -> None:
    snap_term = model.snapshot[1] if model.snapshot else 0
    term = max([model.hard_state.term, snap_term, *(e.term for e in model.entries), 1])
    for _ in range(steps):
        r = rng.random()
        last = model.last_index()
        if r < 0.6:
            floor = max(model.hard_state.commit, model.snapshot[0] if model.snapshot else 0)
            start = last + 1
            if rng.random() < 0.15 and last > floor:
                start = rng.randint(floor + 1, last)  # a new leader overwrites the tail
                term += 1
            batch = [
                Entry(term, i, data=rng.randbytes(rng.choice([0, 5, 40, 300])))
                for i in range(start, start + rng.randint(1, 6))
            ]
            hs = None
            if rng.random() < 0.5:
                top = max(model.hard_state.commit, batch[-1].index)
                commit = rng.randint(model.hard_state.commit, top)
                hs = HardState(term, NodeId(rng.choice(["", "a", "b"])), commit)
            wal.append(batch, hs)
            model.append(batch, hs)
        elif r < 0.85:
            wal.sync()
            model.synced()
        elif r < 0.95 and model.entries and model.hard_state.commit > model.entries[0].index:
            index = rng.randint(model.entries[0].index, model.hard_state.commit)
            t = model.term_at(index)
            assert t is not None
            wal.mark_snapshot(index, t)
            model.mark(index, t)
            wal.compact(index)  # syncs first
            model.synced()
        elif r >= 0.95:
            index = last + rng.randint(0, 5)
            if model.snapshot and index == model.snapshot[0]:
                index += 1  # a leader never re-sends our own snapshot index with a new term
            term += 1
            wal.mark_snapshot(index, term)  # installed from a leader: a reset
            model.mark(index, term)


def check_recovered(c: WalContents, model: Model) -> None:
    assert (tuple(c.entries), c.hard_state, c.snapshot) in model.acceptable


def recover(
    fs: SimFileSystem, kw: dict[str, int | bool], model: Model, rng: random.Random
) -> tuple[Wal, Model]:
    """Reopen after a crash, as a restarting node does; sometimes the disk fails during open."""
    while True:
        if rng.random() < 0.2:
            fs.fail_next_sync(skip=rng.randint(0, 2))
        try:
            wal, c = Wal.open(fs, WAL_DIR, **kw)  # type: ignore[arg-type]
        except WalIOError:
            fs.crash(rng)  # the node dies again; what is on disk must still be acceptable
            continue
        check_recovered(c, model)
        recovered = Model(list(c.entries), c.hard_state, c.snapshot)
        recovered.synced()
        assert wal.last_index == recovered.last_index()
        return wal, recovered


def crash_scenario(seed: int) -> None:
    rng = random.Random(seed)
    fs = SimFileSystem()
    kw: dict[str, int | bool] = {
        "segment_bytes": rng.choice([600, 2048, 8192]),
        "preallocate": rng.random() < 0.7,
    }
    model = Model()
    model.synced()
    wal, model = recover(fs, kw, model, rng)
    for _round in range(4):
        if rng.random() < 0.3:
            fs.fail_next_sync(skip=rng.randint(0, 4))
        try:
            random_workload(wal, model, rng, rng.randint(1, 40))
        except WalIOError:
            assert wal.failed
        fs.crash(rng)
        wal, model = recover(fs, kw, model, rng)


def test_crash_mid_batch_recovers_a_prefix_including_everything_synced() -> None:
    """Random appends, overwrites, snapshots, compactions, rollovers, failed fsyncs and crashes.

    After every crash the log must be one of the states it passed through since the last
    successful sync, record by record: a prefix of what was appended that contains everything
    synced. The Wal then continues from there and is crashed again.
    """
    for seed in range(60):
        crash_scenario(seed)


@pytest.mark.slow
def test_crash_scenarios_many_seeds() -> None:
    for seed in range(60, 3000):
        crash_scenario(seed)


def test_reopen_after_crash_then_crash_again_keeps_truncation() -> None:
    """The torn tail cut on open is itself durable: a second crash cannot revive it."""
    for seed in range(30):
        rng = random.Random(seed)
        fs = SimFileSystem()
        wal, _ = Wal.open(fs, WAL_DIR, segment_bytes=4096)
        wal.append(ents(1, 5))
        wal.sync()
        wal.append(ents(6, 20, size=50))
        fs.crash(rng)
        _, c1 = Wal.open(fs, WAL_DIR, segment_bytes=4096)
        fs.crash(rng)
        _, c2 = Wal.open(fs, WAL_DIR, segment_bytes=4096)
        assert c1 == c2
        assert c1.entries == ents(1, 5) + ents(6, len(c1.entries), size=50)


@pytest.mark.parametrize("cut", [0, 1, 7, 13, 60])
def test_torn_tail_on_a_real_disk(tmp_path: object, cut: int) -> None:
    d = os.path.join(str(tmp_path), "wal")
    fs = RealFileSystem()
    wal, _ = Wal.open(fs, d, segment_bytes=1 << 16)
    wal.append(ents(1, 3))
    wal.sync()
    wal.append(ents(4, 4, size=100))
    wal.sync()
    seg = wal.segments()[-1]
    wal.close()
    # Leave the last record as a crash would: its first `cut` bytes, then preallocated zeros.
    record = ENTRY_RECORD_OVERHEAD + 100
    with open(seg.path, "r+b") as f:
        f.seek(seg.size - record + cut)
        f.write(bytes(record - cut))
    _, c = Wal.open(fs, d, segment_bytes=1 << 16)
    assert c.entries == ents(1, 3)
    assert os.path.getsize(seg.path) == seg.size - record  # cut for good


# --- corruption ----------------------------------------------------------------------------------


def write_segments(fs: FileSystem, d: str, count: int) -> Wal:
    wal, _ = Wal.open(fs, d, segment_bytes=400)
    i = 1
    while len(wal.segments()) < count:
        wal.append(ents(i, i + 2, size=40))
        wal.sync()
        i += 3
    wal.append(ents(i, i + 2, size=40))
    wal.sync()
    return wal


def corrupt(fs: FileSystem, path: str, offset: int, data: bytes) -> None:
    if isinstance(fs, SimFileSystem):
        fs.corrupt(path, offset, data)
    else:
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(data)


def test_corruption_before_the_tail_names_file_and_offset(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal = write_segments(fs, d, 1)
    path = wal.segments()[-1].path
    wal.close()
    # The first segment of a fresh WAL holds the header, then entry 1.
    offset = SEGMENT_HEADER_SIZE
    corrupt(fs, path, offset + ENTRY_RECORD_OVERHEAD + 3, b"\xee")
    with pytest.raises(WalCorruption) as info:
        Wal.open(fs, d, segment_bytes=400)
    assert path in str(info.value) and f"byte offset {offset}" in str(info.value)


def test_corruption_in_a_non_last_segment(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal = write_segments(fs, d, 3)
    segs = wal.segments()
    wal.close()
    # Damage the very last record of the first segment: followed by nothing, but not the tail.
    seg = segs[0]
    data = fs.read_bytes(seg.path)
    last_record = seg.size - (ENTRY_RECORD_OVERHEAD + 40)
    assert struct.unpack_from("<I", data, last_record)[0] == 18 + 40
    corrupt(fs, seg.path, seg.size - 1, b"\x00" if data[-1] else b"\x01")
    with pytest.raises(WalCorruption) as info:
        Wal.open(fs, d, segment_bytes=400)
    assert seg.path in str(info.value) and f"byte offset {last_record}" in str(info.value)


def test_bad_segment_header_is_corruption(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal = write_segments(fs, d, 2)
    seg = wal.segments()[0]
    wal.close()
    corrupt(fs, seg.path, 0, b"XXXX")
    with pytest.raises(WalCorruption, match="header"):
        Wal.open(fs, d, segment_bytes=400)


def test_missing_segment_is_a_gap(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal = write_segments(fs, d, 4)
    seg = wal.segments()[1]
    wal.close()
    fs.remove(seg.path)
    with pytest.raises(WalCorruption, match="gap"):
        Wal.open(fs, d, segment_bytes=400)


def test_missing_first_segment_without_a_snapshot_is_corruption(
    disk: tuple[FileSystem, str],
) -> None:
    fs, d = disk
    wal = write_segments(fs, d, 3)
    seg = wal.segments()[0]
    wal.close()
    fs.remove(seg.path)
    with pytest.raises(WalCorruption, match="missing"):
        Wal.open(fs, d, segment_bytes=400)


def test_torn_segment_creation_is_removed() -> None:
    fs = SimFileSystem()
    wal, _ = Wal.open(fs, WAL_DIR)
    wal.append(ents(1, 3))
    wal.close()
    # A crash while the next segment was created: its header half written.
    f = fs.open_append(f"{WAL_DIR}/{segment_name(2)}")
    f.write(b"TSWL\x01")
    f.preallocate(4096)
    f.sync()
    fs.fsync_dir(WAL_DIR)
    wal, c = Wal.open(fs, WAL_DIR)
    assert c.entries == ents(1, 3)
    # The torn file was removed and its number reused for a fresh segment.
    assert [s.seq for s in wal.segments()] == [1, 2]
    assert fs.read_bytes(f"{WAL_DIR}/{segment_name(2)}")[
        :SEGMENT_HEADER_SIZE
    ] != b"TSWL\x01" + bytes(SEGMENT_HEADER_SIZE - 5)
    wal.close()
    _, c = Wal.open(fs, WAL_DIR)
    assert c.entries == ents(1, 3)


# --- I/O failures --------------------------------------------------------------------------------


def assert_failed_for_good(wal: Wal) -> None:
    with pytest.raises(WalIOError):
        wal.append(ents(wal.last_index + 1, wal.last_index + 1))
    with pytest.raises(WalIOError):
        wal.sync()
    with pytest.raises(WalIOError):
        wal.mark_snapshot(wal.last_index, 1)
    with pytest.raises(WalIOError):
        wal.compact(0)
    assert wal.failed
    wal.close()  # releasing the handle still works


def test_failed_sync_fails_the_wal_for_good() -> None:
    for seed in range(10):
        fs = SimFileSystem()
        wal, _ = Wal.open(fs, WAL_DIR, segment_bytes=4096)
        wal.append(ents(1, 3))
        wal.sync()
        wal.append(ents(4, 6))
        fs.fail_next_sync("wal-")
        with pytest.raises(WalIOError, match="sync"):
            wal.sync()
        syncs = fs.syncs
        assert_failed_for_good(wal)
        assert fs.syncs == syncs  # never retried
        fs.crash(random.Random(seed))
        _, c = Wal.open(fs, WAL_DIR, segment_bytes=4096)
        assert c.entries == ents(1, len(c.entries))
        assert len(c.entries) >= 3


def test_failed_sync_during_rollover_fails_the_wal() -> None:
    fs = SimFileSystem()
    wal, _ = Wal.open(fs, WAL_DIR, segment_bytes=256)
    wal.append(ents(1, 10, size=40))
    fs.fail_next_sync(segment_name(2))  # the new segment's first sync
    with pytest.raises(WalIOError, match="creating segment"):
        wal.sync()
    assert_failed_for_good(wal)
    fs.crash(random.Random(0))
    _, c = Wal.open(fs, WAL_DIR, segment_bytes=256)
    assert c.entries == ents(1, 10, size=40)  # the old segment was finished and synced


class FailingWrites:
    """A FileSystem wrapper whose appends fail with ENOSPC once armed."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner
        self.armed = False

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def open_append(self, path: str, *, position: int | None = None) -> AppendFile:
        outer = self
        inner = self.inner.open_append(path, position=position)

        class File:
            path = inner.path

            def write(self, data: bytes) -> None:
                if outer.armed:
                    raise OSError(errno.ENOSPC, "no space left on device", path)
                inner.write(data)

            def __getattr__(self, name: str) -> object:
                return getattr(inner, name)

        return File()  # type: ignore[return-value]


def test_failed_write_fails_the_wal() -> None:
    fs = FailingWrites(SimFileSystem())
    wal, _ = Wal.open(fs, WAL_DIR)  # type: ignore[arg-type]
    wal.append(ents(1, 2))
    fs.armed = True
    with pytest.raises(WalIOError, match="write"):
        wal.append(ents(3, 4))
    assert_failed_for_good(wal)


def test_closed_wal_refuses_work(disk: tuple[FileSystem, str]) -> None:
    fs, d = disk
    wal, _ = Wal.open(fs, d, segment_bytes=SEG)
    wal.close()
    wal.close()
    with pytest.raises(ValueError, match="closed"):
        wal.append(ents(1, 1))
