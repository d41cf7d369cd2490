"""When a RaftNode takes a snapshot, at which index, and with which membership.

Theory of operation
-------------------
A snapshot lets a node drop the log it covers. Two kinds of state machine take them differently
(`node_api`):

* A plain `StateMachine` (sys.catalog, the KV demo) is serialized whole, at the applied index,
  every `snapshot_interval_entries` applied entries, or at once when someone waits for one
  (`RaftNode.snapshot_now`). The payload is the state; a follower behind the leader's log is
  sent it.

* An `AnchoredStateMachine` (a tablet) keeps its own durable files, so a snapshot is taken at
  the index those files hold (`durable_index()`, a tablet's flushed index) whenever it has
  moved on, and carries only an *anchor*, a reference to that index. Nothing is serialized,
  so it costs a small file write and a log truncation, and the log is kept exactly from what
  the files do not yet hold (less `snapshot_catchup_entries` kept for followers slightly
  behind): Kudu's WAL anchored by the flushed index. Such a snapshot cannot be sent; the group
  runs with `RaftOptions.send_snapshots=False` and a follower behind the log gets a tablet copy.
  A wait for a snapshot (`snapshot_now`) is answered by the first one at or past its index.

A snapshot below the applied index needs the membership *as of its index*, not the current one:
`ConfigHistory` remembers each configuration applied since the last snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.raft import RaftConfig

__all__ = ["ConfigHistory", "SnapshotPlan", "plan_snapshot"]


class ConfigHistory:
    """The applied membership at every index from the last snapshot on.

    Invariants: `base` is the config as of `base_index`; `changes` holds (index, config) for
    each config entry applied after `base_index`, in increasing index order.
    """

    def __init__(self, base_index: int, base: RaftConfig) -> None:
        self.base_index = base_index
        self.base = base
        self.changes: list[tuple[int, RaftConfig]] = []

    def applied(self, index: int, config: RaftConfig) -> None:
        """A config entry at `index` was applied, giving `config`."""
        if index > self.base_index and (not self.changes or index > self.changes[-1][0]):
            self.changes.append((index, config))

    def at(self, index: int) -> RaftConfig:
        """The config as of `index` (at or after `base_index`)."""
        if index < self.base_index:
            raise ValueError(f"config at {index}: history starts at {self.base_index}")
        config = self.base
        for i, c in self.changes:
            if i > index:
                break
            config = c
        return config

    def snapshotted(self, index: int) -> None:
        """A snapshot at `index` was taken: forget what lies before it."""
        self.base = self.at(index)
        self.base_index = index
        self.changes = [(i, c) for i, c in self.changes if i > index]

    def reset(self, index: int, config: RaftConfig) -> None:
        """A snapshot from the leader was installed: the history starts again there."""
        self.base_index, self.base, self.changes = index, config, []


@dataclass(frozen=True, slots=True)
class SnapshotPlan:
    index: int
    """Where the snapshot is taken."""


def plan_snapshot(
    *,
    anchored: bool,
    applied: int,
    durable: int,
    last_snapshot: int,
    interval: int,
    waiting_for: int,
) -> SnapshotPlan | None:
    """Whether to take a snapshot now, and at which index (module docstring).

    `durable`: an anchored state machine's durable index (ignored otherwise); `waiting_for`:
    the highest index a `snapshot_now` caller waits for a snapshot at or past (0: none)."""
    if anchored:
        index = min(durable, applied)
        return SnapshotPlan(index) if index > last_snapshot else None
    forced = waiting_for > last_snapshot
    if applied <= last_snapshot or (not forced and applied - last_snapshot < interval):
        return None
    return SnapshotPlan(applied)
