"""The leader's view of each follower's log (etcd-io/raft's Progress and Inflights).

A follower's progress is in one of three states:

  PROBE      we do not know where its log ends: send one append at a time and wait for the
             answer (or a heartbeat response) before sending the next. Entered on election and
             after a rejection.
  REPLICATE  its log matches up to `match`: stream appends optimistically (next = last sent + 1),
             bounded by `Inflights` (count and bytes): that is the pipeline and flow control.
  SNAPSHOT   it needs entries we compacted: a snapshot is on its way; send nothing else until
             it reports back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum


class ProgressState(Enum):
    PROBE = "PROBE"
    REPLICATE = "REPLICATE"
    SNAPSHOT = "SNAPSHOT"


@dataclass(slots=True)
class Inflights:
    """Appends sent but not acknowledged: (last index, bytes) in send order."""

    max_count: int
    max_bytes: int
    _q: deque[tuple[int, int]] = field(default_factory=deque)
    _bytes: int = 0

    def add(self, index: int, size: int) -> None:
        self._q.append((index, size))
        self._bytes += size

    def free_le(self, index: int) -> None:
        """An ack for `index` frees every message up to it."""
        while self._q and self._q[0][0] <= index:
            _, size = self._q.popleft()
            self._bytes -= size

    def free_first_one(self) -> None:
        """Free one slot: a heartbeat response proves the follower is alive even if an
        append was lost, and the pipeline must not stay blocked on it."""
        if self._q:
            _, size = self._q.popleft()
            self._bytes -= size

    def reset(self) -> None:
        self._q.clear()
        self._bytes = 0

    def full(self) -> bool:
        return len(self._q) >= self.max_count or (
            self.max_bytes > 0 and self._bytes >= self.max_bytes
        )

    def __len__(self) -> int:
        return len(self._q)

    @property
    def bytes(self) -> int:
        return self._bytes


@dataclass(slots=True)
class Progress:
    """Invariant: match < next; in SNAPSHOT state pending_snapshot > 0."""

    match: int
    next: int
    inflights: Inflights
    state: ProgressState = ProgressState.PROBE
    pending_snapshot: int = 0
    recent_active: bool = False
    probe_sent: bool = False
    is_learner: bool = False
    lease_tick: int = -(10**9)
    """Leader tick at which the newest heartbeat this follower acknowledged was sent."""

    def reset_state(self, state: ProgressState) -> None:
        self.probe_sent = False
        self.pending_snapshot = 0
        self.state = state
        self.inflights.reset()

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            pending = self.pending_snapshot
            self.reset_state(ProgressState.PROBE)
            self.next = max(self.match + 1, pending + 1)
        else:
            self.reset_state(ProgressState.PROBE)
            self.next = self.match + 1

    def become_replicate(self) -> None:
        self.reset_state(ProgressState.REPLICATE)
        self.next = self.match + 1

    def become_snapshot(self, snapshot_index: int) -> None:
        self.reset_state(ProgressState.SNAPSHOT)
        self.pending_snapshot = snapshot_index

    def maybe_update(self, index: int) -> bool:
        """An ack for `index`; returns whether `match` advanced."""
        updated = False
        if self.match < index:
            self.match = index
            updated = True
            self.probe_sent = False
        self.next = max(self.next, index + 1)
        return updated

    def optimistic_update(self, last_sent: int) -> None:
        self.next = last_sent + 1

    def maybe_decr_to(self, rejected: int, match_hint: int) -> bool:
        """A rejection of the append at `rejected`; returns False if it is stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False  # stale: we already know the follower has it
            self.next = self.match + 1
            return True
        if self.next - 1 != rejected:
            return False  # stale: not the probe we sent last
        self.next = max(min(rejected, match_hint + 1), 1)
        self.probe_sent = False
        return True

    def is_paused(self) -> bool:
        if self.state is ProgressState.PROBE:
            return self.probe_sent
        if self.state is ProgressState.REPLICATE:
            return self.inflights.full()
        return True
