"""Linearizable reads on the leader: ReadIndex and the leader lease (Raft thesis §6.4).

Theory of operation
-------------------
Split out of `raft.py` (etcd-io/raft keeps the same logic in read_only.go). The functions take
the core they act on as their first argument and see it only through `ReadCore`, the part of it
they need (`raft.Raft` implements it; this module never imports `raft.py`, which imports it);
the leader's bookkeeping lives in its `ReadIndexQueue`.

ReadIndex: the leader records its commit index for the request, confirms that it is still the
leader with a heartbeat round carrying the request's context, and once a quorum of voters
answered releases a `ReadState(index, ctx)`; the caller serves the read after applying up to
that index. A confirmation for one request confirms every request queued before it. The commit
index is only known to be current once an entry of the leader's own term has committed, so a
request that arrives before that waits (`awaiting_commit`) and is issued from `on_commit`.

Lease: with `lease_reads` (and check-quorum), the read is released at once while a quorum
acknowledged a heartbeat sent less than `election_tick - 1` ticks ago: followers ignore votes
for a full election timeout after hearing from the leader, so no other leader can exist in that
window. Not during, nor for two election timeouts after, a leadership transfer (its VOTE
bypasses that rule).

A single-voter group is its own quorum: its reads are released at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from service.raft.log import RaftLog
from service.raft.progress import Progress
from service.raft.types import NodeId, RaftConfig, ReadState, Role


@dataclass(slots=True)
class _ReadIndexStatus:
    index: int
    acks: set[NodeId] = field(default_factory=set)


@dataclass(slots=True)
class ReadIndexQueue:
    """A leader's ReadIndex requests: waiting for a quorum, in arrival order, or for the first
    commit of its term. Cleared whenever the node's term or role changes."""

    pending: dict[bytes, _ReadIndexStatus] = field(default_factory=dict)
    order: list[bytes] = field(default_factory=list)
    awaiting_commit: list[bytes] = field(default_factory=list)

    def clear(self) -> None:
        self.pending.clear()
        self.order.clear()
        self.awaiting_commit.clear()

    def known(self, ctx: bytes) -> bool:
        return ctx in self.pending or ctx in self.awaiting_commit


class ReadOptions(Protocol):
    """The options the read path reads (`raft.RaftOptions` has them)."""

    @property
    def lease_reads(self) -> bool: ...
    @property
    def check_quorum(self) -> bool: ...
    @property
    def election_tick(self) -> int: ...


class ReadCore(Protocol):
    """What ReadIndex and the lease need of the Raft core (`raft.Raft` implements it).

    Read: who this node is, its options, log, configuration, role, term, tick count, its
    followers' progress (their last heartbeat acknowledgement, `Progress.lease_tick`) and the
    state of a leadership transfer. Changed in place: its queue of pending reads and the
    `ReadState`s released for the next Ready. Sent: a heartbeat round carrying a read's
    context."""

    @property
    def id(self) -> NodeId: ...
    @property
    def opts(self) -> ReadOptions: ...
    @property
    def log(self) -> RaftLog: ...
    @property
    def config(self) -> RaftConfig: ...
    @property
    def state(self) -> Role: ...
    @property
    def term(self) -> int: ...
    @property
    def tick_count(self) -> int: ...
    @property
    def prs(self) -> Mapping[NodeId, Progress]: ...
    @property
    def lead_transferee(self) -> NodeId: ...
    @property
    def last_transfer_tick(self) -> int: ...
    @property
    def reads(self) -> ReadIndexQueue: ...
    @property
    def read_states(self) -> list[ReadState]: ...

    def broadcast_heartbeat(self, ctx: bytes) -> None:
        """As leader, send every peer a heartbeat carrying `ctx` (b"": no read)."""
        ...


def committed_in_term(r: ReadCore) -> bool:
    return r.log.term_or_zero(r.log.committed) == r.term


def lease_valid(r: ReadCore) -> bool:
    if not (r.opts.lease_reads and r.opts.check_quorum and r.state is Role.LEADER):
        return False
    if r.lead_transferee or r.tick_count - r.last_transfer_tick < 2 * r.opts.election_tick:
        return False
    horizon = r.tick_count - (r.opts.election_tick - 1)
    fresh = sum(
        1 for n in r.config.voters if n == r.id or (n in r.prs and r.prs[n].lease_tick > horizon)
    )
    return fresh >= r.config.quorum()


def issue(r: ReadCore, ctx: bytes) -> None:
    """Start (or, before this term's first commit, park) the read with context `ctx`."""
    if not committed_in_term(r):
        # The commit index is only known to be current once this term's no-op commits.
        r.reads.awaiting_commit.append(ctx)
        return
    if r.config.voters == {r.id} or lease_valid(r):
        r.read_states.append(ReadState(r.log.committed, ctx))
        return
    r.reads.pending[ctx] = _ReadIndexStatus(r.log.committed, {r.id})
    r.reads.order.append(ctx)
    r.broadcast_heartbeat(ctx)


def last_pending(r: ReadCore) -> bytes:
    """The context of the newest read still waiting for a quorum (b"" if none): every regular
    heartbeat carries it, as etcd's do, so a read whose own heartbeat round lost a message is
    confirmed by the next round instead of waiting forever."""
    return r.reads.order[-1] if r.reads.order else b""


def on_commit(r: ReadCore) -> None:
    """The commit index advanced: issue the reads that waited for this term's first commit."""
    if r.state is Role.LEADER and r.reads.awaiting_commit and committed_in_term(r):
        waiting, r.reads.awaiting_commit = r.reads.awaiting_commit, []
        for ctx in waiting:
            issue(r, ctx)


def on_heartbeat_ack(r: ReadCore, ctx: bytes, frm: NodeId) -> None:
    """`frm` answered the heartbeat round of read `ctx`."""
    status = r.reads.pending.get(ctx)
    if status is None:
        return
    status.acks.add(frm)
    if sum(1 for n in r.config.voters if n in status.acks) < r.config.quorum():
        return
    # Confirming leadership for this request confirms it for every earlier one too.
    order = r.reads.order
    while order:
        c = order.pop(0)
        st = r.reads.pending.pop(c)
        r.read_states.append(ReadState(st.index, c))
        if c == ctx:
            break
