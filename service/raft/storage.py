"""The stable-log interface the core reads, and an in-memory implementation of it.

The core never writes to storage. The caller persists what a `Ready` hands it (to the WAL) and
then appends the same entries here, so `Storage` always reflects durable state. This is
etcd-io/raft's split: `RaftLog` = stable entries (Storage) + unstable entries (not yet persisted).

`MemoryStorage` is what the asyncio shell actually uses: the WAL is the durable copy and
`MemoryStorage` the indexable one, rebuilt from the WAL at start-up. It keeps a dummy entry at
position 0 whose index/term are those of the last snapshot (or 0/0), so `term(first_index - 1)`
is always answerable — the log-matching check of an append right after a snapshot needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Protocol

from service.raft.types import (
    EMPTY_HARD_STATE,
    ENTRY_OVERHEAD,
    Entry,
    HardState,
    RaftConfig,
    Snapshot,
    SnapshotMeta,
)

_data = attrgetter("data")


class StorageError(Exception):
    pass


class Compacted(StorageError):
    """The requested index is older than the first retained entry (use a snapshot)."""


class Unavailable(StorageError):
    """The requested index is newer than the last entry."""


class SnapshotOutOfDate(StorageError):
    """An older snapshot than the one already held was offered."""


class Storage(Protocol):
    def initial_state(self) -> tuple[HardState, RaftConfig | None]:
        """The durable hard state and, if a snapshot exists, its config."""
        ...

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi); at least one entry if any is in range, even if over max_bytes."""
        ...

    def term(self, index: int) -> int: ...

    def first_index(self) -> int: ...

    def last_index(self) -> int: ...

    def snapshot(self) -> Snapshot: ...


def entries_size(entries: Sequence[Entry]) -> int:
    """Sum of `Entry.size()` over `entries`, in one pass of C-level iteration (it runs for
    every append a leader sends, over every entry in it)."""
    return ENTRY_OVERHEAD * len(entries) + sum(map(len, map(_data, entries)))


def limit_size(entries: list[Entry], max_bytes: int | None) -> list[Entry]:
    """The longest prefix of `entries` within `max_bytes`, but never empty if `entries` is not."""
    if max_bytes is None or not entries or entries_size(entries) <= max_bytes:
        return entries  # the common case: everything fits
    total = 0
    for i, e in enumerate(entries):
        total += e.size()
        if total > max_bytes and i > 0:
            return entries[:i]
    return entries


class MemoryStorage:
    """Invariant: `_ents[0]` is a dummy with the snapshot's index/term; `_ents[i].index ==
    _ents[0].index + i` (contiguous)."""

    def __init__(self) -> None:
        self._hard_state = EMPTY_HARD_STATE
        self._snapshot = Snapshot(SnapshotMeta(0, 0, RaftConfig(frozenset())))
        self._has_snapshot = False
        self._ents: list[Entry] = [Entry(term=0, index=0)]

    # -- Storage protocol -------------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, RaftConfig | None]:
        return self._hard_state, (self._snapshot.meta.config if self._has_snapshot else None)

    def entries(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise Compacted(f"entry {lo} compacted (first index {offset + 1})")
        if hi > self.last_index() + 1:
            raise Unavailable(f"entries up to {hi - 1} requested, last index {self.last_index()}")
        return limit_size(self._ents[lo - offset : hi - offset], max_bytes)

    def term(self, index: int) -> int:
        offset = self._ents[0].index
        if index < offset:
            raise Compacted(f"term of {index} compacted (snapshot at {offset})")
        if index - offset >= len(self._ents):
            raise Unavailable(f"term of {index} unavailable (last index {self.last_index()})")
        return self._ents[index - offset].term

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- mutation by the caller, after the data is durable ----------------------------------

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = hs

    def append(self, entries: list[Entry]) -> None:
        """Append persisted entries, truncating any conflicting suffix."""
        if not entries:
            return
        first = self.first_index()
        last = entries[-1].index
        if last < first:
            return  # all compacted already
        if entries[0].index < first:
            entries = entries[first - entries[0].index :]
        offset = entries[0].index - self._ents[0].index
        if offset > len(self._ents):
            raise Unavailable(
                f"missing log entry: last index {self.last_index()}, appending {entries[0].index}"
            )
        del self._ents[offset:]
        self._ents.extend(entries)

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the whole log with a received snapshot."""
        if snap.meta.index < self._snapshot.meta.index:
            raise SnapshotOutOfDate(
                f"snapshot at {snap.meta.index} older than held {self._snapshot.meta.index}"
            )
        self._snapshot = snap
        self._has_snapshot = True
        self._ents = [Entry(term=snap.meta.term, index=snap.meta.index)]

    def create_snapshot(self, index: int, config: RaftConfig, data: bytes) -> Snapshot:
        """Record a snapshot of the state machine as of applied `index` (not compacting)."""
        if index <= self._snapshot.meta.index:
            raise SnapshotOutOfDate(
                f"snapshot at {index} not newer than {self._snapshot.meta.index}"
            )
        if index > self.last_index():
            raise Unavailable(f"snapshot index {index} beyond last index {self.last_index()}")
        snap = Snapshot(SnapshotMeta(index, self.term(index), config), data)
        self._snapshot = snap
        self._has_snapshot = True
        return snap

    def compact(self, index: int) -> None:
        """Discard entries up to and including `index` (which must be <= the snapshot's)."""
        offset = self._ents[0].index
        if index <= offset:
            return
        if index > self.last_index():
            raise Unavailable(f"compact {index} beyond last index {self.last_index()}")
        i = index - offset
        self._ents = [
            Entry(term=self._ents[i].term, index=self._ents[i].index),
            *self._ents[i + 1 :],
        ]
