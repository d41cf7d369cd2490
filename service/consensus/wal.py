"""The write-ahead log: Raft entries, hard state and snapshot markers in CRC'd segment files.

Theory of operation
-------------------
The log is a directory of segment files `wal-{seq:08d}.log` (docs/design/consensus.md#R5). Each
segment starts with a 20-byte header and holds a sequence of records::

    header:  magic "TSWL" | u16 format version | u16 flags (0) | u64 seq | u32 crc32c(first 16)
    record:  u32 length | u32 crc32c(type + payload) | u8 type | payload      (length = 1 + payload)

    ENTRY       u64 term | u64 index | u8 entry type | data
    HARD_STATE  u64 term | u64 commit | u16 vote length | vote (utf-8)
    SNAPSHOT    u64 index | u64 term | u8 flags (bit 0: RESET)

All integers are little-endian. A zero length field ends the log: segments are preallocated
(see `fs.py`), so everything after the last record reads as zeros.

*Group commit.* `append` only encodes and writes (one `write` per call, no sync); `sync` issues one
fdatasync for everything appended since the previous one. The caller (the task that owns the
RawNode) batches all proposals of a Ready into one `append` + `sync`; that is group commit, and
it is what lets throughput exceed one fdatasync per entry.

*Replay.* `Wal.open` reads every segment in order and applies the records:

* an ENTRY whose index is at or below the last index overwrites: it truncates the suffix from
  its index (a new leader overwriting an uncommitted tail, Raft §5.3). An entry beyond
  last index + 1 is a gap, which is corruption.
* a SNAPSHOT marker (a snapshot at index/term was durably saved elsewhere) drops entries up to
  its index. If it has the RESET flag it drops every entry: the node installed a snapshot that
  does not match its log (Raft's restore), so the older entries after it are stale and must not
  come back after a restart. The live `Wal` decides the flag from the terms it tracks, so replay
  never has to guess.
* the latest HARD_STATE wins.

*Torn tail versus corruption.* A crash mid-write leaves the last segment with a record cut short
or failing its CRC, followed only by zeros or end of file: that record was never acknowledged
(it was not synced), so it is cut off and the segment truncated. The same damage anywhere else
(an earlier segment, or followed by non-zero bytes) means acknowledged data is bad: `WalCorruption`
names the file and byte offset and the node must stop (docs/design/consensus.md#R6).

*Segments.* Every `open` and every rollover starts a new segment and writes the latest hard state
and snapshot marker at its start, so older segments can be deleted without losing either.
Rollover happens inside `sync` once the active segment passes `segment_bytes`: the segment is
finished (preallocated space truncated, fdatasync) before the next one is created, so only the
last segment can ever have a torn tail. `compact(i)` deletes the oldest non-active segments while
all their entries are at or below `i`; deleting only a prefix keeps replay order meaningful (an
older segment may hold entries that a newer, deleted one overwrote).

*Failures.* Any OSError while writing, syncing or deleting puts the `Wal` in a failed state: that
call and every later one raises `WalIOError`. An fsync is never retried (fsyncgate, `fs.py`); the
node must restart and replay from what is really on disk.

The `Wal` is owned by one task and is not thread-safe. `sync` may run in a worker thread only while
no other method is called.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import posixpath
import re
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import google_crc32c

from service.common.config import WalSettings
from service.common.errors import Corruption, IOFatal
from service.consensus.fs import AppendFile, FileSystem
from service.raft.types import EMPTY_HARD_STATE, Entry, EntryType, HardState, NodeId

log = logging.getLogger(__name__)

_WAL = WalSettings()
"""`[wal]` with its defaults, those of `Wal.open` (servers pass their configured ones)."""
DEFAULT_SEGMENT_BYTES = _WAL.segment_size_bytes
FORMAT_VERSION = 1
SEGMENT_MAGIC = b"TSWL"

REC_ENTRY = 1
REC_HARD_STATE = 2
REC_SNAPSHOT = 3
SNAPSHOT_RESET = 0x01

_SEG_HEADER = struct.Struct("<4sHHQ")  # magic, version, flags, seq; then u32 crc of these
_CRC = struct.Struct("<I")
SEGMENT_HEADER_SIZE = _SEG_HEADER.size + _CRC.size
_REC_HEAD = struct.Struct("<II")  # length of (type + payload), crc32c of (type + payload)
_ENTRY = struct.Struct("<BQQB")  # record type, term, index, entry type; then data
_HARD_STATE = struct.Struct("<BQQH")  # record type, term, commit, vote length; then vote
_SNAPSHOT = struct.Struct("<BQQB")  # record type, index, term, flags
_MAX_VOTE_BYTES = 0xFFFF

_SEGMENT_NAME = re.compile(r"^wal-(\d{8,})\.log$")
_ENTRY_TYPES = {int(t): t for t in EntryType}

_crc = google_crc32c.value
_crc_extend = google_crc32c.extend


class WalCorruption(Corruption):
    """The log on disk is damaged before its tail (or is inconsistent); the node must stop."""


class WalIOError(IOFatal):
    """A disk write, fsync or delete failed; the Wal refuses all further work."""


def segment_name(seq: int) -> str:
    return f"wal-{seq:08d}.log"


@dataclass(frozen=True, slots=True)
class WalContents:
    """What replay found: the state the Raft node restarts from."""

    snapshot: tuple[int, int] | None
    """(index, term) of the latest snapshot marker, or None."""
    hard_state: HardState
    entries: list[Entry]
    """Every entry above the snapshot index, contiguous, overwrites applied."""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    seq: int
    path: str
    first_index: int | None
    """Smallest entry index written in the segment (None: no entries)."""
    last_index: int | None
    """Largest entry index written in the segment (None: no entries)."""
    size: int
    """Bytes of header and records (preallocated space excluded)."""


@dataclass(slots=True)
class WalMetrics:
    bytes_written: int = 0
    entries_written: int = 0
    syncs: int = 0
    last_sync_seconds: float = 0.0
    total_sync_seconds: float = 0.0
    segments_created: int = 0
    segments_deleted: int = 0


@dataclass(slots=True)
class _Segment:
    seq: int
    path: str
    first_index: int | None = None
    last_index: int | None = None
    size: int = 0

    def note_entries(self, first: int, last: int) -> None:
        self.first_index = first if self.first_index is None else min(self.first_index, first)
        self.last_index = last if self.last_index is None else max(self.last_index, last)


class _ShapeError(ValueError):
    """A record sequence that breaks the log's rules (a caller bug live, corruption on replay)."""


class _LogShape:
    """Which indexes the log holds and their terms, without holding the entries.

    Both the live `Wal` and replay use it, so the two cannot disagree about overwrite and
    snapshot rules.

    Invariants: the log holds indexes [first, last]; it is empty iff last == first - 1, and then
    `last` is the snapshot index (or 0). `_starts` is ascending with `_starts[0] == first` when
    non-empty; `_terms[i]` is the term of indexes [_starts[i], _starts[i + 1]). Terms change
    rarely, so these run lists stay tiny.
    """

    __slots__ = ("_starts", "_terms", "first", "last", "snapshot")

    def __init__(self) -> None:
        self.first = 1
        self.last = 0
        self.snapshot: tuple[int, int] | None = None
        self._starts: list[int] = []
        self._terms: list[int] = []

    @property
    def empty(self) -> bool:
        return self.last < self.first

    @property
    def last_term(self) -> int:
        """Term of the last entry; only meaningful when not empty."""
        return self._terms[-1]

    @property
    def snapshot_index(self) -> int:
        return self.snapshot[0] if self.snapshot is not None else 0

    def term_at(self, index: int) -> int | None:
        if self.snapshot is not None and index == self.snapshot[0]:
            return self.snapshot[1]
        if not self.first <= index <= self.last:
            return None
        return self._terms[bisect.bisect_right(self._starts, index) - 1]

    def check_append(self, index: int, term: int, *, replay: bool) -> None:
        """Check that entries may be appended starting at `index` with term `term`.

        Live appends must connect to the log (index <= last + 1). On replay, after compaction
        deleted older segments, a run may also start anywhere above the snapshot.
        """
        if index <= self.snapshot_index:
            raise _ShapeError(
                f"entry {index} is at or below the snapshot index {self.snapshot_index}"
            )
        if (replay and self.empty) or (replay and index < self.first):
            return
        if index > self.last + 1:
            raise _ShapeError(f"gap: entry {index} follows last index {self.last}")
        prev = self.term_at(index - 1)
        if prev is not None and term < prev:
            raise _ShapeError(f"entry {index} has term {term} below its predecessor's {prev}")

    def splice(self, first: int, last: int, starts: list[int], terms: list[int]) -> None:
        """Entries [first, last] (term runs `starts`/`terms`) replace the log from `first` on."""
        if self.empty or first < self.first:
            self._starts, self._terms, self.first = [], [], first
        else:
            cut = bisect.bisect_left(self._starts, first)
            del self._starts[cut:]
            del self._terms[cut:]
        if self._terms and self._terms[-1] == terms[0]:
            starts, terms = starts[1:], terms[1:]
        self._starts.extend(starts)
        self._terms.extend(terms)
        self.last = last

    def check_snapshot(self, index: int, term: int) -> None:
        if self.snapshot is not None:
            s_index, s_term = self.snapshot
            if index < s_index or (index == s_index and term != s_term):
                raise _ShapeError(
                    f"snapshot marker ({index}, {term}) goes back from ({s_index}, {s_term})"
                )
        if index < 0 or term < 0:
            raise _ShapeError(f"snapshot marker ({index}, {term}) is negative")

    def snapshot_resets(self, index: int, term: int) -> bool:
        """Whether a snapshot at (index, term) discards the whole log (Raft's restore).

        It keeps the entries after it only if the log holds (index, term) itself, or the log
        already starts right after it (the same snapshot marked again).
        """
        if self.empty:
            return True
        if index < self.first:
            return False
        return self.term_at(index) != term

    def mark_snapshot(self, index: int, term: int, *, reset: bool) -> None:
        self.check_snapshot(index, term)
        if reset or self.empty or index >= self.last:
            self._starts, self._terms = [], []
            self.last = max(self.last, index) if self.empty else index
            self.first = self.last + 1
        elif index >= self.first:
            i = bisect.bisect_right(self._starts, index + 1) - 1
            self._starts = self._starts[i:]
            self._terms = self._terms[i:]
            self._starts[0] = self.first = index + 1
        self.snapshot = (index, term)


class _Replay:
    """Applies decoded records in log order; keeps the entries list in step with the shape."""

    def __init__(self) -> None:
        self.shape = _LogShape()
        self.entries: list[Entry] = []
        self.hard_state = EMPTY_HARD_STATE
        self.run_origin = ""  # where the current run of entries began, for error messages

    def entry(self, e: Entry, where: str) -> None:
        shape = self.shape
        if e.index == shape.last + 1 and not shape.empty and e.term == shape.last_term:
            shape.last += 1  # the common case: the next entry of the same term
            self.entries.append(e)
            return
        shape.check_append(e.index, e.term, replay=True)
        if shape.empty or e.index < shape.first:
            self.entries.clear()
            self.run_origin = where
        else:
            del self.entries[e.index - shape.first :]
        shape.splice(e.index, e.index, [e.index], [e.term])
        self.entries.append(e)

    def snapshot(self, index: int, term: int, reset: bool) -> None:
        shape = self.shape
        old_first = shape.first
        shape.mark_snapshot(index, term, reset=reset)
        if shape.empty:
            self.entries.clear()
        else:
            del self.entries[: shape.first - old_first]


def _encode_hard_state(hs: HardState) -> bytes:
    vote = hs.vote.encode()
    if len(vote) > _MAX_VOTE_BYTES:
        raise ValueError(f"vote {hs.vote!r} longer than {_MAX_VOTE_BYTES} bytes")
    body = _HARD_STATE.pack(REC_HARD_STATE, hs.term, hs.commit, len(vote)) + vote
    return _REC_HEAD.pack(len(body), _crc(body)) + body


def _encode_snapshot(index: int, term: int, reset: bool) -> bytes:
    body = _SNAPSHOT.pack(REC_SNAPSHOT, index, term, SNAPSHOT_RESET if reset else 0)
    return _REC_HEAD.pack(len(body), _crc(body)) + body


def _encode_header(seq: int) -> bytes:
    head = _SEG_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, 0, seq)
    return head + _CRC.pack(_crc(head))


def _all_zero(data: bytes, start: int) -> bool:
    return start >= len(data) or data.count(0, start) == len(data) - start


class _TornTail(Exception):
    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(reason)
        self.offset = offset
        self.reason = reason


def _scan_segment(
    path: str, data: bytes, seq: int, is_last: bool, replay: _Replay, seg: _Segment
) -> int:
    """Replay one segment's records; return the offset where its log ends.

    Returns -1 when the last segment's header itself is torn (the segment was being created).
    Raises `_TornTail` for a torn record in the last segment, `WalCorruption` otherwise.
    """
    n = len(data)
    if n < SEGMENT_HEADER_SIZE or _CRC.unpack_from(data, _SEG_HEADER.size)[0] != _crc(
        data[: _SEG_HEADER.size]
    ):
        if is_last and _all_zero(data, SEGMENT_HEADER_SIZE):
            return -1
        raise WalCorruption(f"{path}: bad segment header at byte offset 0")
    magic, version, _flags, header_seq = _SEG_HEADER.unpack_from(data, 0)
    if magic != SEGMENT_MAGIC or version != FORMAT_VERSION:
        raise WalCorruption(
            f"{path}: not a version {FORMAT_VERSION} WAL segment ({magic!r} v{version})"
        )
    if header_seq != seq:
        raise WalCorruption(f"{path}: header says segment {header_seq}, file name says {seq}")

    pos = SEGMENT_HEADER_SIZE
    while pos < n:
        end = pos + _REC_HEAD.size
        if end > n:
            bad = "record header cut short"
        else:
            length, crc = _REC_HEAD.unpack_from(data, pos)
            if length == 0:
                if _all_zero(data, pos):
                    return pos  # preallocated space: the end of the log
                raise WalCorruption(
                    f"{path}: zero record length followed by data at byte offset {pos}"
                )
            end = pos + _REC_HEAD.size + length
            if end > n:
                bad = f"record of {length} bytes cut short at end of file"
            elif _crc(data[pos + _REC_HEAD.size : end]) != crc:
                bad = "record CRC mismatch"
            else:
                try:
                    _apply_record(data, pos, end, replay, seg, f"{path} at byte offset {pos}")
                except _ShapeError as e:
                    raise WalCorruption(
                        f"{path}: inconsistent log at byte offset {pos}: {e}"
                    ) from e
                pos = end
                continue
        if is_last and _all_zero(data, min(end, n)):
            raise _TornTail(pos, bad)
        raise WalCorruption(f"{path}: corrupt WAL record at byte offset {pos}: {bad}")
    return pos


def _apply_record(
    data: bytes, pos: int, end: int, replay: _Replay, seg: _Segment, where: str
) -> None:
    body = pos + _REC_HEAD.size
    rtype = data[body]
    length = end - body
    if rtype == REC_ENTRY and length >= _ENTRY.size:
        _, term, index, etype = _ENTRY.unpack_from(data, body)
        entry_type = _ENTRY_TYPES.get(etype)
        if entry_type is None:
            raise WalCorruption(f"{where}: unknown entry type {etype}")
        replay.entry(Entry(term, index, entry_type, data[body + _ENTRY.size : end]), where)
        seg.note_entries(index, index)
    elif rtype == REC_HARD_STATE and length >= _HARD_STATE.size:
        _, term, commit, vlen = _HARD_STATE.unpack_from(data, body)
        if length != _HARD_STATE.size + vlen:
            raise WalCorruption(f"{where}: hard state record of wrong length {length}")
        try:
            vote = data[body + _HARD_STATE.size : end].decode()
        except UnicodeDecodeError as e:
            raise WalCorruption(f"{where}: hard state vote is not utf-8") from e
        replay.hard_state = HardState(term=term, vote=NodeId(vote), commit=commit)
    elif rtype == REC_SNAPSHOT and length == _SNAPSHOT.size:
        _, index, term, flags = _SNAPSHOT.unpack_from(data, body)
        replay.snapshot(index, term, bool(flags & SNAPSHOT_RESET))
    else:
        # The CRC matched, so these are the bytes the writer meant: a newer format, not rot.
        raise WalCorruption(f"{where}: unknown record type {rtype} of length {length}")


class Wal:
    """The write-ahead log of one Raft group. Create it with `Wal.open`."""

    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        *,
        segment_bytes: int,
        preallocate: bool,
        clock: Callable[[], float],
        shape: _LogShape,
        hard_state: HardState,
        segments: list[_Segment],
    ) -> None:
        self._fs = fs
        self._dir = directory
        self._segment_bytes = segment_bytes
        self._preallocate = preallocate
        self._clock = clock
        self._shape = shape
        self._hard_state = hard_state
        self._segments = segments  # oldest first; once started, the last one is active
        self._active: AppendFile | None = None
        self._dirty = False  # bytes written to the active segment since the last sync
        self._failed: BaseException | None = None
        self._closed = False
        self.metrics = WalMetrics()
        self.on_sync: Callable[[float], None] | None = None
        """Called with the seconds each successful fdatasync took (a server's fsync latency
        histogram). It may run in the worker thread `sync` runs in, so it must be thread-safe;
        it must not raise."""

    # --- opening -------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        fs: FileSystem,
        directory: str,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        preallocate: bool = _WAL.preallocate,
        clock: Callable[[], float] = time.perf_counter,
        on_sync: Callable[[float], None] | None = None,
    ) -> tuple[Wal, WalContents]:
        """Replay the log in `directory` (created if missing) and start a new active segment.

        `on_sync` (see the attribute) observes the duration of every fdatasync of `sync`.
        Raises WalCorruption for damage before the tail, WalIOError if the disk fails.
        """
        if segment_bytes <= SEGMENT_HEADER_SIZE:
            raise ValueError(f"segment_bytes {segment_bytes} is too small")
        try:
            wal, contents = cls._open(fs, directory, segment_bytes, preallocate, clock)
        except OSError as e:
            raise WalIOError(f"WAL {directory}: I/O error while opening: {e}") from e
        wal.on_sync = on_sync
        return wal, contents

    @classmethod
    def _open(
        cls,
        fs: FileSystem,
        directory: str,
        segment_bytes: int,
        preallocate: bool,
        clock: Callable[[], float],
    ) -> tuple[Wal, WalContents]:
        fs.makedirs(directory)
        found = sorted(
            (int(m.group(1)), name)
            for name in fs.listdir(directory)
            if (m := _SEGMENT_NAME.match(name)) is not None
        )
        replay = _Replay()
        segments: list[_Segment] = []
        for i, (seq, name) in enumerate(found):
            path = posixpath.join(directory, name)
            data = fs.read_bytes(path)
            is_last = i == len(found) - 1
            seg = _Segment(seq, path)
            try:
                end = _scan_segment(path, data, seq, is_last, replay, seg)
            except _TornTail as torn:
                log.warning(
                    "WAL %s: torn record at byte offset %d (%s), followed only by zeros: "
                    "truncating the unsynced tail",
                    path,
                    torn.offset,
                    torn.reason,
                )
                end = torn.offset
            if end < 0:
                log.warning("WAL %s: segment header torn while it was created: removing it", path)
                fs.remove(path)
                fs.fsync_dir(directory)
                continue
            if end < len(data):
                # Cut the torn tail (and preallocated zeros) for good before anything follows
                # this segment: from now on it is not the last one, where damage is fatal.
                f = fs.open_append(path, position=end)
                try:
                    f.truncate(end)
                    f.sync()
                finally:
                    f.close()
            seg.size = end
            segments.append(seg)

        shape = replay.shape
        if not shape.empty and shape.first != shape.snapshot_index + 1:
            raise WalCorruption(
                f"WAL {directory}: entries resume at index {shape.first} (run starting in "
                f"{replay.run_origin}) but the snapshot index is {shape.snapshot_index}: "
                "a segment is missing"
            )
        wal = cls(
            fs,
            directory,
            segment_bytes=segment_bytes,
            preallocate=preallocate,
            clock=clock,
            shape=shape,
            hard_state=replay.hard_state,
            segments=segments,
        )
        wal._start_segment(segments[-1].seq + 1 if segments else 1)
        contents = WalContents(shape.snapshot, replay.hard_state, replay.entries)
        return wal, contents

    # --- writing -------------------------------------------------------------------------------

    def append(self, entries: Sequence[Entry] = (), hard_state: HardState | None = None) -> None:
        """Encode and write `entries` then `hard_state` with one write; not durable until sync.

        Entries must be consecutive; the first may overwrite (index <= last_index) but not
        an index at or below the snapshot or the persisted commit index. Raises ValueError for
        those caller bugs (nothing is written), WalIOError if the write fails.
        """
        self._check_usable()
        parts: list[bytes] = []
        first = last = 0
        starts: list[int] = []
        terms: list[int] = []
        if entries:
            shape = self._shape
            e0 = entries[0]
            first = e0.index
            shape.check_append(first, e0.term, replay=False)
            if first <= shape.last and first <= self._hard_state.commit:
                raise ValueError(
                    f"entry {first} would overwrite committed entries (commit "
                    f"{self._hard_state.commit})"
                )
            starts.append(first)
            terms.append(e0.term)
            run_term = e0.term
            expected = first
            pack_entry = _ENTRY.pack
            pack_head = _REC_HEAD.pack
            add = parts.append
            for e in entries:
                if e.index != expected:
                    raise ValueError(f"entries not consecutive: {e.index} after {expected - 1}")
                if e.term != run_term:
                    if e.term < run_term:
                        raise ValueError(f"entry {e.index} term {e.term} below {run_term}")
                    starts.append(e.index)
                    terms.append(e.term)
                    run_term = e.term
                head = pack_entry(REC_ENTRY, e.term, e.index, e.type)
                data = e.data
                if data:
                    add(pack_head(len(head) + len(data), _crc_extend(_crc(head), data)))
                    add(head)
                    add(data)
                else:
                    add(pack_head(len(head), _crc(head)))
                    add(head)
                expected += 1
            last = expected - 1
        if hard_state is not None:
            parts.append(_encode_hard_state(hard_state))
        if not parts:
            return
        self._write(b"".join(parts))
        if entries:
            self._shape.splice(first, last, starts, terms)
            self._segments[-1].note_entries(first, last)
            self.metrics.entries_written += last - first + 1
        if hard_state is not None:
            self._hard_state = hard_state

    def mark_snapshot(self, index: int, term: int) -> None:
        """Record that a snapshot at (index, term) is durably saved elsewhere. Not synced.

        Entries up to `index` are dropped from the log. If the log does not hold (index, term)
        (a snapshot installed from the leader), every entry is dropped: see RESET above.
        """
        self._check_usable()
        shape = self._shape
        shape.check_snapshot(index, term)
        reset = shape.snapshot_resets(index, term)
        self._write(_encode_snapshot(index, term, reset))
        shape.mark_snapshot(index, term, reset=reset)

    def sync(self) -> None:
        """One fdatasync for everything appended since the last sync; may roll the segment."""
        self._check_usable()
        if not self._dirty:
            return
        seg = self._segments[-1]
        roll = seg.size >= self._segment_bytes
        assert self._active is not None
        start = self._clock()
        try:
            if roll and self._preallocate:
                # Finish the segment: drop its preallocated zeros; the sync below covers both.
                self._active.truncate(seg.size)
            self._active.sync()
        except OSError as e:
            raise self._fail(e, "sync") from e
        elapsed = self._clock() - start
        m = self.metrics
        m.syncs += 1
        m.last_sync_seconds = elapsed
        m.total_sync_seconds += elapsed
        if self.on_sync is not None:
            self.on_sync(elapsed)
        self._dirty = False
        if roll:
            self._active.close()
            self._active = None
            self._start_segment(seg.seq + 1)

    def compact(self, snapshot_index: int) -> int:
        """Delete the oldest non-active segments whose entries are all <= `snapshot_index`.

        `snapshot_index` must not exceed the latest snapshot marker; pending appends are synced
        first so that the marker is durable before anything it covers is deleted.
        Returns the number of segments deleted.
        """
        self._check_usable()
        if snapshot_index > self._shape.snapshot_index:
            raise ValueError(
                f"compact({snapshot_index}) beyond the snapshot marker {self._shape.snapshot_index}"
            )
        if self._dirty:
            self.sync()
        deleted = 0
        try:
            while len(self._segments) > 1:
                seg = self._segments[0]
                if seg.last_index is not None and seg.last_index > snapshot_index:
                    break
                self._fs.remove(seg.path)
                self._segments.pop(0)
                deleted += 1
            if deleted:
                self._fs.fsync_dir(self._dir)
        except OSError as e:
            raise self._fail(e, "compaction") from e
        self.metrics.segments_deleted += deleted
        return deleted

    def close(self) -> None:
        """Sync pending appends (unless failed) and release the active segment."""
        if self._closed:
            return
        try:
            if self._failed is None and self._dirty:
                self.sync()
        finally:
            self._closed = True
            if self._active is not None:
                self._active.close()
                self._active = None

    # --- inspection ----------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        """Index of the last entry, or the snapshot index when the log holds none."""
        return self._shape.last

    @property
    def snapshot(self) -> tuple[int, int] | None:
        return self._shape.snapshot

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def term_at(self, index: int) -> int | None:
        """Term of the entry at `index` (or of the snapshot at that index), None if unknown."""
        return self._shape.term_at(index)

    def segments(self) -> list[SegmentInfo]:
        return [
            SegmentInfo(s.seq, s.path, s.first_index, s.last_index, s.size) for s in self._segments
        ]

    # --- internals -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise WalIOError(
                f"WAL {self._dir} failed after an earlier I/O error ({self._failed}); "
                "the node must restart"
            ) from self._failed
        if self._closed:
            raise ValueError(f"WAL {self._dir} is closed")

    def _fail(self, cause: OSError, what: str) -> WalIOError:
        """Enter the failed state (for good: never retry an fsync) and return the error."""
        self._failed = cause
        if self._active is not None:
            with contextlib.suppress(OSError):  # already failing; a close error adds nothing
                self._active.close()
            self._active = None
        return WalIOError(f"WAL {self._dir}: {what} failed: {cause}; the node must restart")

    def _write(self, buf: bytes) -> None:
        assert self._active is not None
        try:
            self._active.write(buf)
        except OSError as e:
            raise self._fail(e, "write") from e
        self._segments[-1].size += len(buf)
        self._dirty = True
        self.metrics.bytes_written += len(buf)

    def _start_segment(self, seq: int) -> None:
        """Create segment `seq` with the latest hard state and snapshot marker, durably."""
        path = posixpath.join(self._dir, segment_name(seq))
        parts = [_encode_header(seq)]
        if self._hard_state != EMPTY_HARD_STATE:
            parts.append(_encode_hard_state(self._hard_state))
        if self._shape.snapshot is not None:
            # Restating the latest marker: entries after it are the current log, so no RESET.
            parts.append(_encode_snapshot(*self._shape.snapshot, reset=False))
        buf = b"".join(parts)
        f: AppendFile | None = None
        try:
            f = self._fs.open_append(path, position=0)
            f.truncate(0)  # a leftover from a crashed creation must not leak old bytes
            if self._preallocate:
                f.preallocate(self._segment_bytes)
            f.write(buf)
            f.sync()
            self._fs.fsync_dir(self._dir)
        except OSError as e:
            if f is not None:
                f.close()
            raise self._fail(e, f"creating segment {path}") from e
        self._active = f
        self._segments.append(_Segment(seq, path, size=len(buf)))
        self._dirty = False
        self.metrics.segments_created += 1
        self.metrics.bytes_written += len(buf)
