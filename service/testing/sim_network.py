"""The simulator's network: Raft messages and quiescence digests in flight, delivered after
a random delay unless dropped or cut off by a partition, and the transport's reports to a
snapshot's sender.

`SimNetwork` is an object the `Simulator` holds (`Simulator.net`, simulator.py) and calls at
each step. It owns the network's state: what is in flight, the partition, how lossy
it is, and the snapshot reports not delivered yet. It draws every random number from the
simulator's one seeded `rng`, in the order the simulator's calls come, so a seed replays
exactly; it reads the simulated time from the simulator's clock and reaches the nodes through
the simulator's map of them, which it never changes. What it does with a node is `NetNode`:
named here, so that this module does not depend on the simulator that imports it.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from typing import Protocol

from service.pb import consensus_pb2 as pb
from service.raft import Message, MessageType, NodeId, RawNode
from service.testing.sim_quiesce import SimQuiescence

__all__ = ["NetNode", "SimNetwork"]


class NetNode(Protocol):
    """A live node as the network reaches it (the simulator's `SimNode`): its Raft core steps
    what arrives, its quiescence (if on) sees messages and digests first, and `process` handles
    the Ready that follows (False: the node crashed doing so)."""

    @property
    def node(self) -> RawNode: ...

    @property
    def quiet(self) -> SimQuiescence | None: ...

    def process(self) -> bool: ...


class SimNetwork:
    """Messages between the simulator's nodes: delays, drops, duplicates, reordering and
    partitions. `clock()` is the simulator's step counter; `nodes` its live nodes (None:
    down)."""

    def __init__(
        self,
        rng: random.Random,
        clock: Callable[[], int],
        nodes: Mapping[NodeId, NetNode | None],
        *,
        max_delay: int,
        drop: float,
        duplicate: float,
    ) -> None:
        self._rng = rng
        self._clock = clock
        self._nodes = nodes
        self._max_delay = max_delay
        """A message or digest arrives 0 to this many steps after it is sent."""
        self._drop = drop
        self._duplicate = duplicate
        self._in_flight: list[tuple[int, int, Message]] = []
        """Raft messages by (due step, send order)."""
        self._digests: list[tuple[int, int, NodeId, NodeId, pb.QuiesceDigest]] = []
        """Quiescence digests by (due step, send order), with their source and destination."""
        self._seq = 0
        """Send order, shared by messages and digests: ties at a step go in send order."""
        self._snapshot_reports: list[tuple[NodeId, NodeId, bool]] = []
        """(sender, peer, delivered) of snapshots delivered or lost since the last step."""
        self._cut: set[tuple[NodeId, NodeId]] = set()
        """The directed links (from, to) a partition cuts: what is sent over them is lost."""

    # -- faults ---------------------------------------------------------------------------------

    @property
    def partitioned(self) -> bool:
        return bool(self._cut)

    def isolate(self, victim: NodeId, ids: list[NodeId]) -> None:
        """Cut `victim` off from every other node of `ids`, both ways."""
        self._cut = {(victim, o) for o in ids if o != victim}
        self._cut |= {(o, victim) for o in ids if o != victim}

    def split(self, side: set[NodeId], ids: list[NodeId]) -> None:
        """Cut every link between `side` and the rest of `ids`, both ways."""
        self._cut = {(a, b) for a in ids for b in ids if (a in side) != (b in side)}

    def one_way(self) -> None:
        """Keep only the cut links from a lower to a higher id: a one-way partition."""
        self._cut = {(a, b) for (a, b) in self._cut if a < b}

    def heal(self) -> None:
        self._cut.clear()

    def make_reliable(self) -> None:
        """No more drops or duplicates (delays and reordering stay): the simulator's final
        convergence. The random draws go on as before, so the run stays a function of its
        seed."""
        self._drop = 0.0
        self._duplicate = 0.0

    # -- Raft messages --------------------------------------------------------------------------

    def send(self, m: Message) -> None:
        rng = self._rng
        if rng.random() < self._drop:
            self._lost(m)
            return
        copies = 2 if rng.random() < self._duplicate else 1
        for _ in range(copies):
            at = self._clock() + rng.randint(0, self._max_delay)
            self._seq += 1
            heapq.heappush(self._in_flight, (at, self._seq, m))

    def deliver_due(self) -> None:
        """Step every message due by now into its node (and let the node handle its Ready)."""
        now = self._clock()
        while self._in_flight and self._in_flight[0][0] <= now:
            _, _, m = heapq.heappop(self._in_flight)
            node = self._nodes.get(m.to)
            if node is None or (m.frm, m.to) in self._cut:
                self._lost(m)
                continue
            if node.quiet is not None:
                node.quiet.on_message(m)
            node.node.step(m)
            if m.type is MessageType.SNAP:
                self._snapshot_reports.append((m.frm, m.to, True))
            node.process()  # False if it crashed: its messages are lost with it

    def _lost(self, m: Message) -> None:
        """Lost messages vanish, except that a snapshot's sender hears of it at the next step
        (the transport reports a failed send: etcd's ReportSnapshot(failure))."""
        if m.type is MessageType.SNAP:
            self._snapshot_reports.append((m.frm, m.to, False))

    def report_snapshots(self) -> None:
        """Snapshots delivered or lost at the last step, reported to their senders (as the
        transport does once one is written to its stream, or failed): without a report a
        leader whose peer's acknowledgement was lost waits for the rest of its term."""
        reports, self._snapshot_reports = self._snapshot_reports, []
        for frm, to, ok in reports:
            node = self._nodes.get(frm)
            if node is not None:
                node.node.report_snapshot(to, ok)
                node.process()

    # -- quiescence digests ---------------------------------------------------------------------

    def send_digest(self, src: NodeId, to: NodeId, digest: pb.QuiesceDigest) -> None:
        """A quiescence digest: the network treats it like a Raft message (sim_quiesce.py).
        Sent to a server that is down or cut off, it fails, as a gRPC send would."""
        if self._nodes.get(to) is None or (src, to) in self._cut:
            sender = self._nodes.get(src)
            if sender is not None and sender.quiet is not None:
                sender.quiet.registry.peer_unreachable(to)
            return
        if self._rng.random() < self._drop:
            return
        at = self._clock() + self._rng.randint(0, self._max_delay)
        self._seq += 1
        heapq.heappush(self._digests, (at, self._seq, src, to, digest))

    def deliver_digests(self) -> None:
        now = self._clock()
        while self._digests and self._digests[0][0] <= now:
            _, _, src, to, digest = heapq.heappop(self._digests)
            node = self._nodes.get(to)
            if node is not None and node.quiet is not None and (src, to) not in self._cut:
                node.quiet.registry.on_digest(src, digest)
