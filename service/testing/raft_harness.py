"""A synchronous in-memory cluster of RawNodes for unit tests of the pure core.

Messages are delivered instantly (FIFO) unless a link is cut; every node follows the Ready
contract exactly (persist to MemoryStorage, send, apply, advance), so what the tests observe
is what the real shell would do, minus time and disks. The randomized simulator
(`service/testing/simulator.py`) adds crashes, delays, reordering and the real WAL.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from service.raft import (
    ConfigChange,
    ConfigChangeType,
    Entry,
    EntryType,
    HardState,
    MemoryStorage,
    Message,
    NodeId,
    RaftConfig,
    RaftOptions,
    RawNode,
    ReadState,
    Role,
    config_after,
)
from service.raft.lateness import DEFAULT_HALF_LIFE_TICK


@dataclass
class NodeState:
    node: RawNode
    storage: MemoryStorage
    applied: list[Entry] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
    applied_config: RaftConfig = field(default_factory=lambda: RaftConfig(frozenset()))
    kv: dict[bytes, bytes] = field(default_factory=dict)


class Cluster:
    def __init__(
        self,
        ids: Iterable[str],
        *,
        seed: int = 0,
        pre_vote: bool = True,
        check_quorum: bool = True,
        election_tick: int = 10,
        heartbeat_tick: int = 1,
        lease_reads: bool = False,
        max_size_per_msg: int = 1 << 20,
        max_inflight_msgs: int = 256,
        send_snapshots: bool = True,
        max_election_tick: int = 0,
        lateness_half_life_tick: int = DEFAULT_HALF_LIFE_TICK,
        election_jitter_tick: int | None = None,
        election_backoff: bool = True,
    ) -> None:
        self.ids = [NodeId(i) for i in ids]
        self.config = RaftConfig(frozenset(self.ids))
        self.seed = seed
        self.opts: dict[str, object] = dict(
            pre_vote=pre_vote,
            check_quorum=check_quorum,
            election_tick=election_tick,
            heartbeat_tick=heartbeat_tick,
            lease_reads=lease_reads,
            max_size_per_msg=max_size_per_msg,
            max_inflight_msgs=max_inflight_msgs,
            send_snapshots=send_snapshots,
            max_election_tick=max_election_tick,
            lateness_half_life_tick=lateness_half_life_tick,
            election_jitter_tick=election_jitter_tick,
            election_backoff=election_backoff,
        )
        self.nodes: dict[NodeId, NodeState] = {}
        for i, nid in enumerate(self.ids):
            self.nodes[nid] = self._new_node(nid, MemoryStorage(), seed * 1000 + i, self.config)
        self.cut: set[tuple[NodeId, NodeId]] = set()
        self.down: set[NodeId] = set()
        self.queue: deque[Message] = deque()
        self.delivered: list[Message] = []
        self.msg_filter: list[Callable[[Message], bool]] = []  # True = drop the message
        self.msg_transform: list[Callable[[Message], Message]] = []  # rewrite in flight

    def _new_node(
        self, nid: NodeId, storage: MemoryStorage, seed: int, config: RaftConfig | None
    ) -> NodeState:
        opts = RaftOptions(id=nid, **self.opts)  # type: ignore[arg-type]
        node = RawNode(opts, storage, random.Random(seed), config)
        st = NodeState(node, storage)
        snap = storage.snapshot()
        empty = RaftConfig(frozenset())
        st.applied_config = snap.meta.config if snap.meta.index else (config or empty)
        return st

    # -- topology ---------------------------------------------------------------------------

    def add_node(self, nid: str) -> NodeState:
        """A brand-new empty node (no config: it learns everything from the leader)."""
        n = NodeId(nid)
        self.ids.append(n)
        self.nodes[n] = self._new_node(n, MemoryStorage(), self.seed * 1000 + len(self.ids), None)
        return self.nodes[n]

    def isolate(self, nid: str) -> None:
        for other in self.ids:
            if other != nid:
                self.cut.add((NodeId(nid), other))
                self.cut.add((other, NodeId(nid)))

    def partition(self, *groups: Iterable[str]) -> None:
        gs = [set(g) for g in groups]
        for a in self.ids:
            for b in self.ids:
                if a != b and not any(a in g and b in g for g in gs):
                    self.cut.add((a, b))

    def heal(self) -> None:
        self.cut.clear()

    def restart(self, nid: str) -> None:
        """Crash and restart `nid` from its durable state (MemoryStorage = what was persisted)."""
        n = NodeId(nid)
        old = self.nodes[n]
        hs = old.storage.hard_state
        applied = old.storage.snapshot().meta.index
        st = self._new_node(n, old.storage, self.seed * 7919 + len(old.applied), self.config)
        st.applied = [e for e in old.applied if e.index <= applied]
        st.kv = {}
        self.nodes[n] = st
        assert st.node.raft.term == hs.term

    def install_copy(self, nid: str, source: str) -> None:
        """Replace `nid` by a copy of `source`'s snapshot (what a tablet copy does,
        docs/design/tablet_copy.md#R4),
        keeping `nid`'s term and vote, and restart it from that."""
        n = NodeId(nid)
        old = self.nodes[n]
        snap = self.nodes[NodeId(source)].storage.snapshot()
        storage = MemoryStorage()
        storage.apply_snapshot(snap)
        storage.set_hard_state(
            HardState(old.storage.hard_state.term, old.storage.hard_state.vote, snap.meta.index)
        )
        st = self._new_node(n, storage, self.seed * 104729 + len(old.applied), None)
        st.kv = decode_kv(snap.data)
        self.nodes[n] = st

    # -- driving ----------------------------------------------------------------------------

    def node(self, nid: str) -> RawNode:
        return self.nodes[NodeId(nid)].node

    def role(self, nid: str) -> Role:
        return self.node(nid).status().role

    def leader(self) -> NodeId | None:
        leaders = [n for n in self.ids if n not in self.down and self.role(n) is Role.LEADER]
        if not leaders:
            return None
        return max(leaders, key=lambda n: self.node(n).raft.term)

    def process(self, nid: NodeId) -> None:
        st = self.nodes[nid]
        while st.node.has_ready():
            rd = st.node.ready()
            if rd.snapshot is not None:
                st.storage.apply_snapshot(rd.snapshot)
                st.applied_config = rd.snapshot.meta.config
                st.kv = decode_kv(rd.snapshot.data)
            if rd.entries:
                st.storage.append(rd.entries)
            if rd.hard_state is not None:
                st.storage.set_hard_state(rd.hard_state)
            self.queue.extend(rd.messages)
            for e in rd.committed_entries:
                st.applied.append(e)
                st.applied_config = config_after(st.applied_config, e.type, e.data, e.index)
                if e.type is EntryType.NORMAL and e.data:
                    k, _, v = e.data.partition(b"=")
                    st.kv[k] = v
            st.read_states.extend(rd.read_states)
            st.node.advance(rd)

    def stabilize(self, max_msgs: int = 100_000) -> None:
        for nid in self.ids:
            if nid not in self.down:
                self.process(nid)
        n = 0
        while self.queue:
            m = self.queue.popleft()
            n += 1
            if n > max_msgs:
                raise RuntimeError("cluster did not stabilize")
            if m.to in self.down or m.frm in self.down or (m.frm, m.to) in self.cut:
                continue
            if any(f(m) for f in self.msg_filter):
                continue
            for t in self.msg_transform:
                m = t(m)
            if m.to not in self.nodes:
                continue
            self.delivered.append(m)
            self.nodes[m.to].node.step(m)
            self.process(m.to)

    def tick(self, nid: str, n: int = 1) -> None:
        for _ in range(n):
            self.node(nid).tick()
            self.stabilize()

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for nid in self.ids:
                if nid not in self.down:
                    self.nodes[nid].node.tick()
            self.stabilize()

    def elect(self, nid: str) -> None:
        self.node(nid).campaign()
        self.stabilize()

    def propose(self, nid: str, data: bytes) -> int:
        index, _ = self.node(nid).propose(data)
        self.stabilize()
        return index

    def change(self, nid: str, type: ConfigChangeType, target: str) -> int:
        node = self.node(nid)
        cc = ConfigChange(type, NodeId(target), node.raft.committed_config.index)
        index, _ = node.propose_config_change(cc)
        self.stabilize()
        return index

    def compact(self, nid: str, index: int | None = None) -> None:
        """Snapshot `nid`'s applied state and discard its log up to there."""
        st = self.nodes[NodeId(nid)]
        idx = index if index is not None else st.node.raft.log.applied
        st.storage.create_snapshot(idx, st.applied_config, encode_kv(st.kv))
        st.storage.compact(idx)

    def committed_data(self, nid: str) -> list[bytes]:
        applied = self.nodes[NodeId(nid)].applied
        return [e.data for e in applied if e.data and e.type is EntryType.NORMAL]


def encode_kv(kv: dict[bytes, bytes]) -> bytes:
    return b"\n".join(k + b"=" + v for k, v in sorted(kv.items()))


def decode_kv(data: bytes) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for line in data.split(b"\n"):
        if line:
            k, _, v = line.partition(b"=")
            out[k] = v
    return out
