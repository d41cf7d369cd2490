"""What a RaftNode's users hand it and get from it: the state machine and transport it drives,
its settings, and the leader-change events it reports.

Kept apart from node.py (which re-exports every name here) so that the node's loop reads on its
own; the master, the tablet servers and the KV demo all build their groups from these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from service.common.config import RaftSettings
from service.raft import Message, NodeId, Role


class StateMachine(Protocol):
    def apply(self, index: int, data: bytes) -> object:
        """Apply a committed entry; the result goes back to the proposer."""
        ...

    def snapshot(self) -> bytes: ...

    def restore(self, data: bytes) -> None: ...


@runtime_checkable
class SlicedSnapshots(Protocol):
    """A state machine whose snapshot is large enough to hold the event loop (sys.catalog's
    rows at 200,000 tablets are 55 MB): `snapshot_sliced` gives `snapshot`'s bytes while
    letting the loop run. The node takes such a snapshot beside its loop, holding its Readies
    meanwhile as during an fsync (docs/design/consensus.md#R10), so the state stays that of
    the snapshot's index and heartbeats go on."""

    async def snapshot_sliced(self) -> bytes: ...


@runtime_checkable
class AnchoredStateMachine(Protocol):
    """A state machine that keeps its own durable state (a tablet's row files), so the Raft log
    need only be kept from what that state already holds (Kudu's log anchors), and a snapshot
    needs no payload: it is an *anchor*, a reference to the state machine's files at an index.

    Such a node never serializes its state and never sends a snapshot: a follower that needs
    entries the leader no longer keeps is given the files some other way (tablet copy,
    docs/design/consensus.md#R10; `RaftOptions.send_snapshots`). See `snapshots.py`."""

    def apply(self, index: int, data: bytes) -> object: ...

    def durable_index(self) -> int:
        """Every entry at or below this index is durable in the state machine's own files."""
        ...

    def anchor(self, index: int) -> bytes:
        """The payload of a snapshot at durable `index` (no state: a reference to it)."""
        ...

    def restore(self, data: bytes) -> None:
        """Check an anchor against the files (at start): they must hold its index."""
        ...


@runtime_checkable
class DecodingStateMachine(Protocol):
    """A state machine that can decode an entry before it commits (docs/design/consensus.md#R11).

    Why. Applying one large entry holds the node's loop: a 10,000-tablet CreateTable entry
    (1.4 MB) took 0.47 s of CPU to apply in sys.catalog, and several seconds of wall time on
    a host short of CPU, during which a follower answered no heartbeat and the leader, hearing
    from no quorum, stepped down. Most of that is decoding, which depends on the entry's bytes
    alone; done ahead, in slices between which the loop runs, it leaves apply only the part
    that reads the state."""

    def decode_ahead(self, index: int, data: bytes) -> asyncio.Future[None] | None:
        """Start decoding the entry appended at `index` (not yet committed: it may still be
        overwritten, so apply checks it is the same bytes). Returns a future done when the
        decoding has ended (done, given up or failed: it never raises), or None when there is
        nothing to decode ahead (a small entry)."""
        ...


class Sender(Protocol):
    """What the node needs from a transport."""

    def send(self, group_id: str, messages: list[Message]) -> None: ...

    def set_address(self, node: str, address: str) -> None: ...

    def address_of(self, node: str) -> str | None: ...


_RAFT = RaftSettings()
"""`[raft]` with its defaults: the one home of the mirrored defaults below."""


@dataclass(frozen=True)
class NodeSettings:
    """The shell's settings: the `[raft]` knobs in the shell's units (`from_raft_settings`),
    then its own. A mirrored field's default is a default `[raft]`'s, never written here again,
    so a node built with no settings times elections as a configured one does."""

    tick_interval_s: float = _RAFT.tick_interval_ms / 1000
    heartbeat_ticks: int = _RAFT.heartbeat_ticks
    election_ticks: int = _RAFT.election_ticks
    election_jitter_ticks: int = _RAFT.election_jitter_ticks
    """Up to this many ticks are added at random to a follower's election timeout (`[raft]`'s
    election_jitter_ms: a heartbeat interval, as Kudu, not a whole election timeout, as etcd,
    which is what the Raft core falls back to when given none)."""
    max_election_ticks: int = _RAFT.max_election_ticks
    """How far the election timeout stretches while peers are late (service/raft/lateness.py)."""
    lateness_half_life_ticks: int = _RAFT.lateness_half_life_ticks
    """How long that lateness is remembered (its half-life)."""
    pre_vote: bool = _RAFT.pre_vote
    check_quorum: bool = _RAFT.check_quorum
    lease_reads: bool = _RAFT.lease_reads
    max_size_per_msg: int = _RAFT.max_entries_per_msg_bytes
    max_inflight_msgs: int = _RAFT.max_inflight_msgs
    max_inflight_bytes: int = _RAFT.max_inflight_bytes
    snapshot_interval_entries: int = _RAFT.snapshot_interval_entries
    snapshot_catchup_entries: int = _RAFT.snapshot_catchup_entries

    # --- the shell's own: defined here only ----------------------------------------------------

    max_batch: int = 4096
    auto_promote: bool = True
    batch_linger_s: float = 0.004
    """Linger under load (node.py): once a batch of at least `linger_min_batch` proposals
    committed, the next batch starts no sooner than this after the previous one did. 0: off."""
    linger_min_batch: int = 8
    """The batch size that shows many clients writing at once; below it nobody lingers."""
    quiesce_ticks: int = 0
    """A leader idle this many ticks stops ticking and heartbeating, and so do its followers
    (quiesce.py; needs a `Quiescence` given to the node). 0: never."""
    apply_slice_s: float = 0.0
    """Applies of the process's groups share the event loop in slices of about this long, so
    that many groups committing at once do not hold up its timers and I/O (turns.py). 0: every
    group applies what it has at once (a process with one group, or cheap entries)."""

    @classmethod
    def from_raft_settings(cls, r: RaftSettings) -> NodeSettings:
        """The shell's settings from a node's `[raft]` config section."""
        return cls(
            tick_interval_s=r.tick_interval_ms / 1000,
            heartbeat_ticks=r.heartbeat_ticks,
            election_ticks=r.election_ticks,
            election_jitter_ticks=r.election_jitter_ticks,
            max_election_ticks=r.max_election_ticks,
            lateness_half_life_ticks=r.lateness_half_life_ticks,
            pre_vote=r.pre_vote,
            check_quorum=r.check_quorum,
            lease_reads=r.lease_reads,
            max_size_per_msg=r.max_entries_per_msg_bytes,
            max_inflight_msgs=r.max_inflight_msgs,
            max_inflight_bytes=r.max_inflight_bytes,
            snapshot_interval_entries=r.snapshot_interval_entries,
            snapshot_catchup_entries=r.snapshot_catchup_entries,
        )


@dataclass(frozen=True)
class LeaderChange:
    leader: NodeId
    term: int
    role: Role


def group_commit_stats(m: Mapping[str, float]) -> str:
    """`RaftNode.metrics` as one line: fdatasyncs and the entries each made durable, messages,
    and (on a leader) proposals per batch. bench/raft_commit.py reports it per node."""
    fsyncs, batches = int(m["fsyncs"]), int(m["batches"])
    per_fsync = m["fsync_entries"] / fsyncs if fsyncs else 0.0
    sync_ms = 1000 * m["fsync_seconds"] / fsyncs if fsyncs else 0.0
    line = (
        f"group commit: {fsyncs} fdatasyncs covering {int(m['fsync_entries'])} entries "
        f"({per_fsync:.1f} per fdatasync, {sync_ms:.2f} ms each until the loop saw it done); "
        f"{int(m['messages_sent'])} messages sent"
    )
    if batches:
        line += f"; {int(m['proposals'])} proposals in {batches} batches"
        line += f" ({m['proposals'] / batches:.1f} each)"
    return line
