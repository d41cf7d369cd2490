"""The simulator's network: Raft messages and quiescence digests in flight, delivered after
a random delay unless dropped or cut off by a partition, and the transport's reports to a
snapshot's sender. A mixin of `Simulator` (simulator.py), which owns the attributes below
and draws every random number from its one seeded `rng`.
"""

from __future__ import annotations

import heapq
import random
from typing import TYPE_CHECKING

from service.pb import consensus_pb2 as pb
from service.raft import Message, MessageType, NodeId

if TYPE_CHECKING:
    from service.testing.simulator import SimNode, SimOptions

__all__ = ["SimNetwork"]


class SimNetwork:
    """Network methods of `Simulator`; the attributes are Simulator's."""

    rng: random.Random
    opts: SimOptions
    now: int
    nodes: dict[NodeId, SimNode | None]
    net: list[tuple[int, int, Message]]
    digests: list[tuple[int, int, NodeId, NodeId, pb.QuiesceDigest]]
    snapshot_reports: list[tuple[NodeId, NodeId, bool]]
    cut: set[tuple[NodeId, NodeId]]
    _seq: int

    def send(self, m: Message) -> None:
        if self.rng.random() < self.opts.drop:
            self._lost(m)
            return
        copies = 2 if self.rng.random() < self.opts.duplicate else 1
        for _ in range(copies):
            at = self.now + self.rng.randint(0, self.opts.max_delay)
            self._seq += 1
            heapq.heappush(self.net, (at, self._seq, m))

    def deliver_due(self) -> None:
        while self.net and self.net[0][0] <= self.now:
            _, _, m = heapq.heappop(self.net)
            node = self.nodes.get(m.to)
            if node is None or (m.frm, m.to) in self.cut:
                self._lost(m)
                continue
            if node.quiet is not None:
                node.quiet.on_message(m)
            node.node.step(m)
            if m.type is MessageType.SNAP:
                self.snapshot_reports.append((m.frm, m.to, True))
            if not node.process():
                continue

    def _lost(self, m: Message) -> None:
        """Lost messages vanish, except that a snapshot's sender hears of it at the next step
        (the transport reports a failed send: etcd's ReportSnapshot(failure))."""
        if m.type is MessageType.SNAP:
            self.snapshot_reports.append((m.frm, m.to, False))

    def report_snapshots(self) -> None:
        """Snapshots delivered or lost at the last step, reported to their senders (as the
        transport does once one is written to its stream, or failed): without a report a
        leader whose peer's acknowledgement was lost waits for the rest of its term."""
        reports, self.snapshot_reports = self.snapshot_reports, []
        for frm, to, ok in reports:
            node = self.nodes.get(frm)
            if node is not None:
                node.node.report_snapshot(to, ok)
                node.process()

    def send_digest(self, src: NodeId, to: NodeId, digest: pb.QuiesceDigest) -> None:
        """A quiescence digest: the network treats it like a Raft message (sim_quiesce.py).
        Sent to a server that is down or cut off, it fails, as a gRPC send would."""
        if self.nodes.get(to) is None or (src, to) in self.cut:
            sender = self.nodes.get(src)
            if sender is not None and sender.quiet is not None:
                sender.quiet.registry.peer_unreachable(to)
            return
        if self.rng.random() < self.opts.drop:
            return
        at = self.now + self.rng.randint(0, self.opts.max_delay)
        self._seq += 1
        heapq.heappush(self.digests, (at, self._seq, src, to, digest))

    def deliver_digests(self) -> None:
        while self.digests and self.digests[0][0] <= self.now:
            _, _, src, to, digest = heapq.heappop(self.digests)
            node = self.nodes.get(to)
            if node is not None and node.quiet is not None and (src, to) not in self.cut:
                node.quiet.registry.on_digest(src, digest)
