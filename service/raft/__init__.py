"""The pure Raft core: no asyncio, grpc, os, time or global random (tests/test_layering.py;
docs/design/consensus.md#R1, docs/design/layers.md#R4).

Modules
-------
    rawnode     `RawNode`, the caller's handle: tick, step, propose, ready, advance
    raft        the state machine: elections, replication, commit, membership, reads
    election    campaigns and votes: pre-vote, check-quorum, leader stickiness
    lateness    election timeouts that stretch while a live group's messages arrive late
    reads       ReadIndex and the leader lease
    log         the log as the core sees it: stable entries, then unstable ones
    storage     the stable-log interface and `MemoryStorage`
    progress    the leader's view of each follower's log (and inflight limits)
    coalesce    one append and one acknowledgement per peer per Ready
    types       the values exchanged with the caller (entries, messages, configs, Ready)

Public surface: `RawNode` and the value types in `types`; `MemoryStorage` for the stable log.
"""

from service.raft.raft import ConfigChangeRefused, ProposalDropped, RaftOptions
from service.raft.rawnode import RawNode, Status, config_after
from service.raft.storage import MemoryStorage, Storage
from service.raft.types import (
    NO_NODE,
    ConfigChange,
    ConfigChangeType,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    NodeId,
    RaftConfig,
    ReadState,
    Ready,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
)

__all__ = [
    "NO_NODE",
    "ConfigChange",
    "ConfigChangeRefused",
    "ConfigChangeType",
    "Entry",
    "EntryType",
    "HardState",
    "MemoryStorage",
    "Message",
    "MessageType",
    "NodeId",
    "ProposalDropped",
    "RaftConfig",
    "RaftOptions",
    "RawNode",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotMeta",
    "SoftState",
    "Status",
    "Storage",
    "config_after",
]
