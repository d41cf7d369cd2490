"""The pure Raft core: no asyncio, grpc, os, time or global random (tests/test_layering.py).

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
