"""Quiescence in the deterministic simulator: idle groups stop ticking, digests stand in.

The production rules, on simulated time and a simulated network: each simulated node gets
the real `Quiescence` registry (consensus/quiesce.py) with the step counter as its clock,
the real predicates (`RawNode.quiet_leader`, `RawNode.quiet_follower`, `heard_from_leader`,
`expire_election_timer`) and `late_answer` (node_quiesce.py); its digests travel through the
simulator's network with the same delays, drops, duplicates, reordering and partitions as
Raft messages (a harsher network than the FIFO stream they use in production).

What it adds to the simulator's checks: Raft's safety properties hold whatever the tick
schedule, so quiescence cannot break them unless it is wrong about more than timing; what it
*can* break is liveness (a follower left asleep under a dead leader, a leader asleep while a
peer needs it). `Simulator.converge` therefore checks, for seeds with quiescence, that after
healing the group elects one leader, applies everything, quiesces as a whole, and wakes and
commits a new write, before its final restart wipes every node's quiescence.

What this module uses of the simulator and its nodes is named here (`QuietSim`, `QuietNode`),
so that it does not depend on the simulator that imports it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, MutableMapping
from typing import Protocol

from service.consensus.node_quiesce import late_answer
from service.consensus.quiesce import Quiescence
from service.pb import consensus_pb2 as pb
from service.raft import Message, NodeId, RawNode

__all__ = [
    "GROUP",
    "QUIESCE_TICKS",
    "DigestNetwork",
    "QuietNode",
    "QuietSim",
    "SimQuiescence",
    "check_quiet_liveness",
    "quiesce_for_seed",
]

GROUP = "g"
QUIESCE_TICKS = 3
"""A leader quiet this many ticks quiesces (production: quiesce_idle_ms / tick_interval_ms)."""


def quiesce_for_seed(seed: int, lease_reads: bool) -> bool:
    """Half the seeds without lease reads (quiescence is refused with lease reads). A random
    stream of its own, so seeds without quiescence replay exactly as they did before it."""
    return not lease_reads and random.Random(f"quiesce/{seed}").random() < 0.5


class QuietNode(Protocol):
    """A simulated node as its quiescence and the liveness check see it (the simulator's
    `SimNode`): its Raft core, what it applied, the client operations and the fsync it has in
    hand (a busy node does not quiesce), and its Ready handling."""

    @property
    def id(self) -> NodeId: ...

    @property
    def node(self) -> RawNode: ...

    @property
    def applied(self) -> int: ...

    @property
    def puts(self) -> Mapping[int, object]: ...

    @property
    def reads(self) -> Mapping[bytes, object]: ...

    @property
    def persisting(self) -> object | None: ...

    @property
    def quiet(self) -> SimQuiescence | None: ...

    def wake(self) -> None: ...

    def process(self) -> bool: ...


class DigestNetwork(Protocol):
    """Where digests go (the simulator's network, `SimNetwork.send_digest`)."""

    def send_digest(self, src: NodeId, to: NodeId, digest: pb.QuiesceDigest) -> None: ...


class QuietSim(Protocol):
    """The simulator as quiescence and `check_quiet_liveness` use it (the `Simulator`): its
    clock, trace and network, its nodes (None: down), and the steps and faults the check
    drives."""

    @property
    def now(self) -> int: ...

    @property
    def net(self) -> DigestNetwork: ...

    @property
    def nodes(self) -> Mapping[NodeId, QuietNode | None]: ...

    @property
    def down_until(self) -> MutableMapping[NodeId, int]: ...

    def log(self, text: str) -> None: ...

    def leader(self) -> NodeId | None: ...

    def live(self, nid: NodeId) -> QuietNode: ...

    def step(self) -> None: ...

    def crash(self, nid: NodeId, why: str) -> None: ...

    def restart(self, nid: NodeId) -> None: ...


class _Sender:
    def __init__(self, sim: QuietSim, src: NodeId) -> None:
        self.sim = sim
        self.src = src

    def send_digest(self, peer: str, digest: pb.QuiesceDigest) -> None:
        self.sim.net.send_digest(self.src, NodeId(peer), digest)


class SimQuiescence:
    """One simulated node's quiescence: its registry (it is its own server) and the node's
    side of the rules, as `NodeQuiescence` (node_quiesce.py) plays them for a RaftNode."""

    group_id = GROUP

    def __init__(self, sim: QuietSim, node: QuietNode) -> None:
        self.sim = sim
        self.node = node
        self.quiesced = False
        self.idle_ticks = 0
        self.registry = Quiescence(
            _Sender(sim, node.id),
            interval_s=float(node.node.raft.opts.heartbeat_tick),
            election_timeout_s=float(node.node.raft.opts.election_tick),
            clock=lambda: float(sim.now),
        )
        self.registry.register(self)

    # -- QuiescentNode (quiesce.py) -------------------------------------------------------------

    def members(self) -> list[str]:
        raft = self.node.node.raft
        return sorted(raft.config.members - {raft.id})  # sorted: replays must not vary

    def quiesce_follower(self, leader: str, term: int, commit: int) -> bool:
        raw = self.node.node
        if (
            self.quiesced
            or self._busy()
            or raw.has_ready()
            or not raw.quiet_follower(NodeId(leader), term, commit)
        ):
            return False
        raw.heard_from_leader()
        self.quiesced = True
        self.sim.log(f"{self.node.id} quiesces following {leader} at {term}/{commit}")
        return True

    def wake(self, *, leader_suspect: bool = False) -> None:
        if not self.quiesced:
            return
        self.quiesced = False
        self.idle_ticks = 0
        self.registry.left(GROUP)
        if leader_suspect:
            self.node.node.expire_election_timer()
        self.sim.log(f"{self.node.id} wakes{' (leader silent)' if leader_suspect else ''}")

    def peer_lost(self, peer: str) -> None:
        """`RaftNode.peer_lost`: the simulator never deletes a replica, so this only wakes."""
        self.wake()
        self.node.node.forget_activity(NodeId(peer))

    # -- what the node does -----------------------------------------------------------------------

    def _busy(self) -> bool:
        n = self.node
        return bool(n.puts or n.reads or n.persisting is not None)

    def on_message(self, m: Message) -> None:
        """Before the node steps `m`: any message but a late heartbeat answer wakes it."""
        if self.quiesced and not late_answer(m, self.node.node.raft.term):
            self.wake()

    def after_tick(self) -> None:
        """A leader's `NodeQuiescence._maybe_quiesce` (node_quiesce.py)."""
        raw = self.node.node
        raft = raw.raft
        if raw.quiet_leader() and self.node.applied == raft.log.committed and not self._busy():
            self.idle_ticks += 1
        else:
            self.idle_ticks = 0
            return
        if self.idle_ticks >= QUIESCE_TICKS and raw.peers_recently_active() and not raw.has_ready():
            self.quiesced = True
            self.registry.lead(GROUP, raft.term, raft.log.committed, self.members())
            self.sim.log(f"{self.node.id} quiesces leading at {raft.term}/{raft.log.committed}")


def _settled(sim: QuietSim, target: int, asleep: bool) -> str | None:
    """None if the group is whole (and, if `asleep`, quiesced): one leader of the highest term
    that every live member follows, everything up to `target` and the leader's commit applied
    by them, nothing in hand, every live member quiesced. Otherwise what is not so yet."""
    leader = sim.leader()
    if leader is None:
        return "no leader"
    lead = sim.live(leader).node.raft
    for nid in sorted(lead.config.members):
        n = sim.nodes[nid]
        if n is None:
            continue  # down on purpose (`check_quiet_liveness`)
        raft = n.node.raft
        if nid != leader and (raft.lead != leader or raft.term != lead.term):
            return f"{nid} follows {raft.lead or 'nobody'} at term {raft.term}, not {leader}"
        if n.applied < max(target, lead.log.committed):
            return f"{nid} applied {n.applied} < {max(target, lead.log.committed)}"
        if n.puts or n.reads:
            return f"{nid} has client operations in hand"
        if asleep and (n.quiet is None or not n.quiet.quiesced):
            return f"{nid} is not quiesced"
    return None


def _settle(sim: QuietSim, target: int, what: str, steps: int, asleep: bool = True) -> str | None:
    why: str | None = "not checked"
    for _ in range(steps):
        sim.step()
        why = _settled(sim, target, asleep)
        if why is None:
            sim.log(f"settled: {what}")
            return None
    return f"group did not settle {what} within {steps} steps: {why}"


def check_quiet_liveness(
    sim: QuietSim, target: int, encode_put: Callable[[str, bytes], bytes], steps: int = 3000
) -> str | None:
    """After healing (every node up, no cut, clients and faults off), three times over:
      1. the group settles and quiesces as a whole (`_settled`);
      2. its leader is killed while quiesced: the others hear no more digests from it, wake
         and elect another leader (when they are still a quorum; they stay awake, as a group
         with a member down does: its leader's progress for the dead one is not caught up);
      3. the dead leader restarts and a put through the leader wakes the group: every member
         applies it and the group quiesces again (`encode_put`: the simulator's state
         machine's put entry).
    Returns what went wrong, or None."""
    why = _settle(sim, target, "after healing", steps)
    if why is not None:
        return why
    victim = sim.leader()
    assert victim is not None
    raft = sim.live(victim).node.raft
    term, voters = raft.term, raft.config.voters
    if len(voters - {victim}) >= raft.config.quorum():
        sim.crash(victim, "quiesced leader killed")
        sim.down_until[victim] = sim.now + 10 * steps  # down until restarted below
        why = _settle(
            sim, target, f"after {victim}, the quiesced leader, died", steps, asleep=False
        )
        if why is not None:
            return why
        if sim.live(sim.leader() or victim).node.raft.term <= term:
            return f"no new term after the quiesced leader {victim} died"
        sim.restart(victim)
    leader = sim.live(sim.leader() or victim)
    leader.wake()
    index, _ = leader.node.propose(encode_put("quiet", str(sim.now).encode()))
    leader.process()
    sim.log(f"{leader.id} proposes a put at {index} to wake the group")
    return _settle(sim, index, "after a write", steps)
