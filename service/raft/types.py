"""Values exchanged between the pure Raft core and its caller.

Everything here is an immutable value (frozen dataclass or enum). The core never sees protobuf:
`service/consensus/codec.py` converts these to and from the wire and disk formats.

Vocabulary follows etcd-io/raft (term, index, hard state, Ready) and Kudu's consensus design for
roles (docs/design/consensus.md#R2):
LEADER, FOLLOWER, CANDIDATE, LEARNER (a non-voter catching up, Kudu's PRE_VOTER) and
NON_PARTICIPANT (a node that is not, or no longer, a member of the configuration).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from service.common.ids import NodeId

NO_NODE = NodeId("")


class Role(Enum):
    """A node's role in its Raft group (docs/design/consensus.md#R2)."""

    FOLLOWER = "FOLLOWER"
    CANDIDATE = "CANDIDATE"
    PRE_CANDIDATE = "PRE_CANDIDATE"
    LEADER = "LEADER"
    LEARNER = "LEARNER"
    NON_PARTICIPANT = "NON_PARTICIPANT"


class EntryType(IntEnum):
    NORMAL = 0
    """Application data; an empty NORMAL entry is the no-op a new leader appends."""
    CONFIG = 1
    """A `ConfigChange`, encoded by `ConfigChange.encode`."""


ENTRY_OVERHEAD = 24
"""Bytes an entry is counted for besides its data (flow control and batching limits)."""


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    type: EntryType = EntryType.NORMAL
    data: bytes = b""

    def size(self) -> int:
        """Approximate bytes, used for flow control and batching limits."""
        return len(self.data) + ENTRY_OVERHEAD


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message that depends on it leaves the node."""

    term: int = 0
    vote: NodeId = NO_NODE
    commit: int = 0


EMPTY_HARD_STATE = HardState()


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Membership: voters count toward quorum; learners (non-voters) only receive the log.

    `index` is the log index of the entry that produced this config (0 for the bootstrap
    config). It is the "committed config op id" of docs/design/tablet_copy.md#R8: config changes
    name it for compare-and-set.
    """

    voters: frozenset[NodeId]
    learners: frozenset[NodeId] = frozenset()
    index: int = 0

    def __post_init__(self) -> None:
        if self.voters & self.learners:
            raise ValueError(f"nodes both voter and learner: {sorted(self.voters & self.learners)}")

    @property
    def members(self) -> frozenset[NodeId]:
        return self.voters | self.learners

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1


class ConfigChangeType(Enum):
    ADD_LEARNER = "ADD_LEARNER"
    """Add a non-voter (Kudu's PRE_VOTER); it is promoted once caught up."""
    PROMOTE = "PROMOTE"
    """Turn a learner into a voter."""
    DEMOTE = "DEMOTE"
    """Turn a voter into a learner (the first half of a graceful removal)."""
    REMOVE = "REMOVE"
    """Remove a voter or learner."""


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One-server-at-a-time membership change (Raft thesis 4.1).

    `expected_index` is the index of the committed config this change replaces
    (compare-and-set, docs/design/consensus.md#R4); the leader refuses the change if it is stale.
    `context` is opaque to the core (the shell carries the new peer's address in it).
    """

    type: ConfigChangeType
    node: NodeId
    expected_index: int
    context: bytes = b""

    def encode(self) -> bytes:
        return json.dumps(
            {
                "type": self.type.value,
                "node": self.node,
                "expected_index": self.expected_index,
                "context": self.context.hex(),
            },
            sort_keys=True,
        ).encode()

    @staticmethod
    def decode(data: bytes) -> ConfigChange:
        d = json.loads(data)
        return ConfigChange(
            type=ConfigChangeType(d["type"]),
            node=NodeId(d["node"]),
            expected_index=int(d["expected_index"]),
            context=bytes.fromhex(d["context"]),
        )

    def apply_to(self, config: RaftConfig, index: int) -> RaftConfig:
        """The config that results from applying this change at log index `index`."""
        voters, learners = set(config.voters), set(config.learners)
        if self.type is ConfigChangeType.ADD_LEARNER:
            voters.discard(self.node)
            learners.add(self.node)
        elif self.type is ConfigChangeType.PROMOTE:
            learners.discard(self.node)
            voters.add(self.node)
        elif self.type is ConfigChangeType.DEMOTE:
            voters.discard(self.node)
            learners.add(self.node)
        else:
            voters.discard(self.node)
            learners.discard(self.node)
        return RaftConfig(frozenset(voters), frozenset(learners), index)


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    index: int
    term: int
    config: RaftConfig


@dataclass(frozen=True, slots=True)
class Snapshot:
    meta: SnapshotMeta
    data: bytes = b""


class MessageType(Enum):
    # local messages (never sent over the network)
    HUP = "HUP"  # start an election (campaign)
    BEAT = "BEAT"  # leader: broadcast heartbeats
    PROP = "PROP"  # a proposal
    CHECK_QUORUM = "CHECK_QUORUM"
    TRANSFER_LEADER = "TRANSFER_LEADER"
    READ_INDEX = "READ_INDEX"  # a linearizable read request, local on the leader
    # network messages
    APP = "APP"
    APP_RESP = "APP_RESP"
    VOTE = "VOTE"
    VOTE_RESP = "VOTE_RESP"
    PRE_VOTE = "PRE_VOTE"
    PRE_VOTE_RESP = "PRE_VOTE_RESP"
    SNAP = "SNAP"
    HEARTBEAT = "HEARTBEAT"
    HEARTBEAT_RESP = "HEARTBEAT_RESP"
    TIMEOUT_NOW = "TIMEOUT_NOW"
    SNAP_STATUS = "SNAP_STATUS"  # local: the shell reports a snapshot send result
    UNREACHABLE = "UNREACHABLE"  # local: the shell reports a peer unreachable


LOCAL_MESSAGES = frozenset(
    {
        MessageType.HUP,
        MessageType.BEAT,
        MessageType.PROP,
        MessageType.CHECK_QUORUM,
        MessageType.TRANSFER_LEADER,
        MessageType.READ_INDEX,
        MessageType.SNAP_STATUS,
        MessageType.UNREACHABLE,
    }
)

RESPONSE_MESSAGES = frozenset(
    {
        MessageType.APP_RESP,
        MessageType.VOTE_RESP,
        MessageType.PRE_VOTE_RESP,
        MessageType.HEARTBEAT_RESP,
    }
)


@dataclass(frozen=True, slots=True)
class Message:
    """A Raft message (etcd-io/raft's raftpb.Message, trimmed).

    Field meaning depends on `type`:
      APP:        index/log_term = the entry preceding `entries`; commit = leader's commit.
      APP_RESP:   index = last matching index (or rejected index); reject_hint = follower's
                  last index when rejecting (for fast back-off); log_term = term at hint.
      VOTE/PRE_VOTE: index/log_term = candidate's last entry.
      HEARTBEAT:  commit = min(leader commit, follower match); context = read-index ctx.
      SNAP:       snapshot set.
    """

    type: MessageType
    to: NodeId = NO_NODE
    frm: NodeId = NO_NODE
    term: int = 0
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the state machine has applied `index`."""

    index: int
    context: bytes


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile state the layers above want to hear about (leader changes)."""

    leader: NodeId
    role: Role
    term: int


@dataclass(slots=True)
class Ready:
    """Work for the caller, processed in this order (etcd-io/raft's contract):

    1. persist `snapshot` (if any), then `entries`, then `hard_state` (if any); fsync when
       `must_sync` is true;
    2. send `messages` (only after step 1: votes and acknowledgements depend on durable
       state), unless `send_before_persist` allows sending them before or during step 1;
    3. apply `snapshot` to the state machine, then `committed_entries` in order (with
       `send_before_persist`, also before step 1 completes: those entries came in earlier
       Readies, durable already);
    4. call `RawNode.advance(ready)`, once step 1 is durable.

    docs/design/consensus.md#R1 says why the leader's early sends and applies are safe.
    """

    soft_state: SoftState | None = None
    hard_state: HardState | None = None
    read_states: list[ReadState] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    committed_entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    must_sync: bool = False
    send_before_persist: bool = False
    """True when `messages` may be sent, and `committed_entries` applied, before step 1
    completes (a leader whose term and vote did not change: its appends overlap its own fsync,
    thesis §10.2.1; it counts itself toward a commit only in `advance`)."""
