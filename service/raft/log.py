"""The Raft log as the core sees it: stable entries (Storage) followed by unstable ones.

Unstable entries were appended by this node (as leader) or received (as follower) but are not
yet durable; the caller persists them from `Ready.entries` and reports back with
`stable_to(index, term)`. An incoming snapshot likewise sits in `unstable_snapshot` until the
caller has saved it.

Invariants:
  * applied <= committed <= last_index()
  * unstable entries start at `unstable_offset` and are contiguous;
    unstable_offset == storage.last_index() + 1 unless a suffix was overwritten in memory.
"""

from __future__ import annotations

from service.raft.storage import Compacted, Storage, Unavailable, limit_size
from service.raft.types import Entry, Snapshot


class LogError(Exception):
    pass


class RaftLog:
    def __init__(self, storage: Storage, max_committed_bytes: int | None = None) -> None:
        self.storage = storage
        self.unstable_snapshot: Snapshot | None = None
        self.unstable: list[Entry] = []
        self.unstable_offset = storage.last_index() + 1
        first = storage.first_index()
        self.committed = first - 1
        self.applied = first - 1
        self.max_committed_bytes = max_committed_bytes

    def __repr__(self) -> str:
        return (
            f"RaftLog(committed={self.committed}, applied={self.applied}, "
            f"unstable_offset={self.unstable_offset}, unstable={len(self.unstable)})"
        )

    # -- indexes ------------------------------------------------------------------------------

    def first_index(self) -> int:
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot.meta.index + 1
        return self.storage.first_index()

    def last_index(self) -> int:
        if self.unstable:
            return self.unstable_offset + len(self.unstable) - 1
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot.meta.index
        return self.storage.last_index()

    def term(self, index: int) -> int:
        """Term of the entry at `index`; raises Compacted/Unavailable when out of range."""
        if self.unstable_snapshot is not None and index == self.unstable_snapshot.meta.index:
            return self.unstable_snapshot.meta.term
        if self.unstable and index >= self.unstable_offset:
            if index > self.last_index():
                raise Unavailable(f"term of {index}: last index {self.last_index()}")
            return self.unstable[index - self.unstable_offset].term
        if self.unstable_snapshot is not None and index < self.unstable_snapshot.meta.index:
            raise Compacted(f"term of {index}: below snapshot {self.unstable_snapshot.meta.index}")
        if index > self.last_index():
            raise Unavailable(f"term of {index}: last index {self.last_index()}")
        return self.storage.term(index)

    def term_or_zero(self, index: int) -> int:
        try:
            return self.term(index)
        except (Compacted, Unavailable):
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, index: int, term: int) -> bool:
        try:
            return self.term(index) == term
        except (Compacted, Unavailable):
            return False

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """Raft §5.4.1: the candidate's log is at least as up-to-date as ours."""
        our_term = self.last_term()
        return term > our_term or (term == our_term and last_index >= self.last_index())

    # -- reading entries ----------------------------------------------------------------------

    def slice(self, lo: int, hi: int, max_bytes: int | None = None) -> list[Entry]:
        """Entries [lo, hi), limited by size (but at least one)."""
        if lo > hi:
            raise LogError(f"invalid slice {lo} > {hi}")
        first = self.first_index()
        if lo < first:
            raise Compacted(f"slice from {lo}: first index {first}")
        if hi > self.last_index() + 1:
            raise LogError(f"slice to {hi - 1}: last index {self.last_index()}")
        if lo == hi:
            return []
        out: list[Entry] = []
        if lo < self.unstable_offset:
            out = self.storage.entries(lo, min(hi, self.unstable_offset), max_bytes)
            if len(out) < min(hi, self.unstable_offset) - lo:
                return out  # size-limited inside storage
        if hi > self.unstable_offset:
            start = max(lo, self.unstable_offset) - self.unstable_offset
            out = out + self.unstable[start : hi - self.unstable_offset]
        return limit_size(out, max_bytes)

    def entries_from(self, index: int, max_bytes: int | None = None) -> list[Entry]:
        if index > self.last_index():
            return []
        return self.slice(index, self.last_index() + 1, max_bytes)

    def has_next_committed(self) -> bool:
        return self.committed > max(self.applied, self.first_index() - 1)

    def next_committed(self) -> list[Entry]:
        """Committed entries not yet handed to the caller for application."""
        lo = max(self.applied + 1, self.first_index())
        if self.committed + 1 > lo:
            return self.slice(lo, self.committed + 1, self.max_committed_bytes)
        return []

    # -- appending ----------------------------------------------------------------------------

    def find_conflict(self, entries: list[Entry]) -> int:
        """Index of the first entry whose term differs from ours (or is new); 0 if none."""
        for e in entries:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """The largest index <= `index` whose term is <= `term` (fast back-off, etcd)."""
        while index > 0:
            try:
                t = self.term(index)
            except (Compacted, Unavailable):
                break
            if t <= term:
                break
            index -= 1
        return index

    def append(self, entries: list[Entry]) -> int:
        """Append (truncating a conflicting unstable/stable suffix); returns last index."""
        if not entries:
            return self.last_index()
        after = entries[0].index - 1
        if after < self.committed:
            raise LogError(f"append after {after} would overwrite committed {self.committed}")
        self._truncate_and_append(entries)
        return self.last_index()

    def _truncate_and_append(self, entries: list[Entry]) -> None:
        first = entries[0].index
        if first == self.unstable_offset + len(self.unstable):
            self.unstable.extend(entries)
        elif first <= self.unstable_offset:
            # Replacing everything unstable (and possibly a stable suffix: the caller's storage
            # truncates when it persists these).
            self.unstable_offset = first
            self.unstable = list(entries)
        else:
            keep = self.slice(self.unstable_offset, first)
            self.unstable = keep + list(entries)

    def maybe_append(
        self, index: int, log_term: int, committed: int, entries: list[Entry]
    ) -> tuple[int, int] | None:
        """Follower side of AppendEntries (Figure 2, rules 2-5).

        Returns (last new index, first index written or 0 if nothing was written), or None
        when the log does not contain an entry at `index` with term `log_term`. Entries we
        already have are skipped, so a duplicated or reordered append never truncates."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(entries)
        conflict = self.find_conflict(entries)
        if conflict:
            if conflict <= self.committed:
                raise LogError(f"entry {conflict} conflicts with committed {self.committed}")
            self.append(entries[conflict - index - 1 :])
        self.commit_to(min(committed, last_new))
        return last_new, conflict

    # -- commit, apply, stable ----------------------------------------------------------------

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            if index > self.last_index():
                raise LogError(f"commit {index} beyond last index {self.last_index()}")
            self.committed = index

    def maybe_commit(self, index: int, term: int) -> bool:
        """Leader: advance commit to `index` only if that entry is from `term` (Figure 8)."""
        if index > self.committed and self.term_or_zero(index) == term:
            self.commit_to(index)
            return True
        return False

    def applied_to(self, index: int) -> None:
        if index == 0:
            return
        if index > self.committed or index < self.applied:
            raise LogError(f"applied {index} outside [{self.applied}, {self.committed}]")
        self.applied = index

    def stable_to(self, index: int, term: int) -> None:
        """The caller persisted entries up to `index` (with `term`)."""
        if index < self.unstable_offset:
            return
        pos = index - self.unstable_offset
        if pos >= len(self.unstable) or self.unstable[pos].term != term:
            return  # overwritten in the meantime; a later Ready will carry the new entries
        self.unstable = self.unstable[pos + 1 :]
        self.unstable_offset = index + 1

    def stable_snap_to(self, index: int) -> None:
        if self.unstable_snapshot is not None and self.unstable_snapshot.meta.index == index:
            self.unstable_snapshot = None

    def restore(self, snap: Snapshot) -> None:
        """Replace the log with a snapshot received from the leader."""
        self.committed = snap.meta.index
        self.unstable_snapshot = snap
        self.unstable = []
        self.unstable_offset = snap.meta.index + 1

    def snapshot(self) -> Snapshot:
        if self.unstable_snapshot is not None:
            return self.unstable_snapshot
        return self.storage.snapshot()
