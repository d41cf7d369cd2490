"""Quiescence: idle Raft groups stop ticking and heartbeating.

Theory of operation
-------------------
A tablet server hosts hundreds of Raft groups, and most of them are idle most of the time. An
idle group still costs its leader a heartbeat to every follower each heartbeat interval, and
every replica a wakeup at every tick; on the 2-core benchmark machine that was 0.4-0.6 ms of
CPU per second per idle replica, so a server with 1,000 idle replicas spent half a core doing
nothing. Ticks and heartbeats only drive *timing* (elections, leader liveness); nothing about
Raft's safety depends on them. So an idle group can stop both, as CockroachDB quiesces ranges
and TiKV hibernates regions, provided something else tells its followers when to start again.

*Leader.* A leader whose group has been idle for `NodeSettings.quiesce_ticks` (its log fully
committed and applied, every peer's match at its last index and answered since the last
quorum check, nothing proposed, read, changed or transferred: `RawNode.quiet_leader` plus
node_quiesce.py's `_maybe_quiesce`) stops ticking and enters `Quiescence.lead`. A group with
a member down therefore stays awake (its progress for the dead member is not caught up) until
the member returns or is replaced; a woken leader finds its peers' answers still counted, so
check-quorum gives it a full election timeout before it judges them again.

*Digest.* Once per heartbeat interval each server sends every peer it shares a group with one
`QuiesceDigest` in the ordinary Raft stream (transport.py): the groups it leads quiesced of
which that peer is a member, each with its term and commit index. One small message per peer
per interval, in place of a heartbeat and its answer per group.

*Follower.* A follower that is told, by a digest from its own leader, that its group is
quiesced at its term, and whose log ends at that commit index and has committed it
(`RawNode.quiet_follower`), stops its election timer, restarted first as for a heartbeat: the
digest is the leader's word that it is alive (`NodeQuiescence.quiesce_follower`). It starts
ticking again when
  * any Raft message for the group arrives (the leader woke up: a proposal, a config change);
  * the next digest from its leader's server does not list the group (the leader woke, lost
    its leadership, or the replica was deleted or restarted);
  * no digest has come from the leader's server for an election timeout (the server died or
    is cut off). Then the follower's election clock is moved to a full election timeout, so
    it campaigns within its random jitter, and, with check_quorum, no longer refuses votes
    because it has "heard from a leader recently" (it has not).

*A lost replica.* A member's server that no longer hosts a group (its replica was deleted:
an operator's DeleteTablet, a stale tombstone landing just after a move re-added it) cannot
wake the quiesced leader with a pre-vote, and the leader, asleep, would count it caught up for
good. So a server answers a digest that lists groups it does not host with `not_hosted` in its
next digest to that peer, and the leader wakes those groups with the member counted as not
heard from (`peer_lost`): it then stays awake and copies the tablet to it again
(service/tserver/tablet_copy.py).

*Waking.* Anything that hands a node work (a message, a proposal, a read, a config change, a
leadership transfer, a report of an unreachable peer) wakes it first (`NodeQuiescence.wake`),
and it leaves the digest. A digest that cannot be sent to a peer's server wakes every group led
here with that peer (`peer_unreachable`): a leader that lost its quorum then steps down by
check-quorum as it would awake, instead of sleeping on as a leader nobody follows. A
follower that missed the quiesce (its commit was behind) times out and pre-votes; that message
wakes the leader, whose heartbeats bring the follower back.

*Why it is safe.* Only timing changes: every message is still stepped at once, and the Raft
core's rules are untouched. The one thing that leans on timing for safety, lease reads, turns
quiescence off (config validation): a quiesced leader cut off from its group would otherwise
serve reads from a lease it no longer holds. ReadIndex reads need a quorum's answer, so they
stay linearizable on a leader that does not know it was deposed.

*Why it stays live.* Every rule above that wakes a node is also a safety net for the others:
a follower that did not quiesce keeps its election timer and, timing out, sends a pre-vote
that wakes the leader. The deterministic simulator runs half its seeds with quiescence (this
registry and the core's predicates on simulated time, digests on its lossy network) and
checks after healing that the group quiesces, elects a new leader when the quiesced one is
killed, and wakes for a write (testing/sim_quiesce.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from service.common.periodic import Periodic
from service.pb import consensus_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["Quiescence", "QuiescentNode"]


class QuiescentNode(Protocol):
    """What the registry needs from a RaftNode (node.py)."""

    group_id: str

    @property
    def quiesced(self) -> bool: ...

    def members(self) -> Iterable[str]:
        """Every other member of the group's current config."""
        ...

    def quiesce_follower(self, leader: str, term: int, commit: int) -> bool:
        """Stop ticking if this is a caught-up follower of `leader` at `term` and `commit`."""
        ...

    def wake(self, *, leader_suspect: bool = False) -> None: ...

    def peer_lost(self, peer: str) -> None:
        """As leader: `peer`'s server says it does not host the group. Wake, and count the
        peer as not heard from (so the group does not quiesce again around it)."""
        ...


class DigestSender(Protocol):
    def send_digest(self, peer: str, digest: pb.QuiesceDigest) -> None: ...


class Quiescence:
    """One per server process: its quiesced groups, digests to peers, and leader liveness."""

    def __init__(
        self,
        transport: DigestSender,
        *,
        interval_s: float,
        election_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.transport = transport
        self.interval_s = interval_s
        self.election_timeout_s = election_timeout_s
        self.clock = clock
        self._nodes: dict[str, QuiescentNode] = {}
        self._leading: dict[str, tuple[int, int, tuple[str, ...]]] = {}
        """group -> (term, commit, members) of the groups this server leads quiesced."""
        self._following: dict[str, str] = {}
        """group -> leader uuid of the groups quiesced here as followers."""
        self._under: dict[str, set[str]] = {}
        """leader uuid -> the groups in `_following` it leads (a digest touches only these)."""
        self._heard: dict[str, float] = {}
        """peer uuid -> when its last digest arrived."""
        self._missing: dict[str, set[str]] = {}
        """peer uuid -> groups its digests listed that are not hosted here (answered with the
        next digest to it, `not_hosted`)."""
        self._periodic = Periodic("raft-quiescence", interval_s, self.beat, log)
        self.digests_sent = 0
        self.woken_by_silence = 0
        self.lost_replicas = 0
        """Quiesced groups led here woken because a member's server no longer hosts them."""

    # -- membership ----------------------------------------------------------------------------

    def register(self, node: QuiescentNode) -> None:
        self._nodes[node.group_id] = node

    def unregister(self, group_id: str) -> None:
        self._nodes.pop(group_id, None)
        self.left(group_id)

    def lead(self, group_id: str, term: int, commit: int, members: Iterable[str]) -> None:
        """The node of `group_id` quiesced as the leader at `term`, everything up to `commit`
        replicated to `members`."""
        self._leading[group_id] = (term, commit, tuple(members))

    def left(self, group_id: str) -> None:
        """The node of `group_id` ticks again (or is gone)."""
        self._leading.pop(group_id, None)
        leader = self._following.pop(group_id, None)
        if leader is not None:
            under = self._under[leader]
            under.discard(group_id)
            if not under:
                del self._under[leader]

    @property
    def leading(self) -> int:
        return len(self._leading)

    @property
    def following(self) -> int:
        return len(self._following)

    # -- the periodic work ---------------------------------------------------------------------

    async def start(self) -> None:
        self._periodic.start()

    async def aclose(self) -> None:
        await self._periodic.aclose()

    def beat(self) -> None:
        """Send this interval's digests, and wake followers whose leader went silent."""
        self.send_digests()
        self.check_leaders(self.clock())

    def send_digests(self) -> None:
        digests: dict[str, pb.QuiesceDigest] = {}
        # Every peer of every group here gets one, empty or not: the digest is also the
        # liveness signal, and an empty one ends followers quiesced under a past leadership.
        for node in self._nodes.values():
            for peer in node.members():
                if peer not in digests:
                    digests[peer] = pb.QuiesceDigest()
        for group_id, (term, commit, members) in self._leading.items():
            for peer in members:
                digest = digests.get(peer)
                if digest is None:
                    digest = digests[peer] = pb.QuiesceDigest()
                digest.groups.add(group_id=group_id, term=term, commit=commit)
        missing, self._missing = self._missing, {}
        for peer, groups in missing.items():
            digest = digests.get(peer)
            if digest is None:
                digest = digests[peer] = pb.QuiesceDigest()
            digest.not_hosted.extend(sorted(groups))
        for peer, digest in digests.items():
            self.transport.send_digest(peer, digest)
        self.digests_sent += len(digests)

    def check_leaders(self, now: float) -> None:
        silent = [
            leader
            for leader in self._under
            if now - self._heard.get(leader, 0.0) > self.election_timeout_s
        ]
        for leader in silent:
            for group_id in list(self._under.get(leader, ())):
                self.left(group_id)
                node = self._nodes.get(group_id)
                if node is not None:
                    self.woken_by_silence += 1
                    node.wake(leader_suspect=True)

    def peer_unreachable(self, peer: str) -> None:
        """A send to `peer`'s server failed (the transport says so): wake every group led
        here quiesced with `peer` as a member. They heartbeat again, so the leader's progress
        for it goes back to probing (no quiescing while it is down) and check-quorum judges
        the group as it would without quiescence: a leader that lost its quorum steps down."""
        for group_id, (_, _, members) in list(self._leading.items()):
            if peer in members:
                node = self._nodes.get(group_id)
                self.left(group_id)
                if node is not None:
                    node.wake()

    # -- receiving -----------------------------------------------------------------------------

    def on_digest(self, src: str, digest: pb.QuiesceDigest) -> None:
        """A digest from `src` (called by the transport after the request's Raft messages)."""
        self._heard[src] = self.clock()
        for group_id in digest.not_hosted:
            lost = self._nodes.get(group_id)
            members = self._leading.get(group_id, (0, 0, ()))[2]
            if lost is not None and src in members:
                self.left(group_id)
                self.lost_replicas += 1
                lost.peer_lost(src)
        listed: set[str] = set()
        for g in digest.groups:
            listed.add(g.group_id)
            if g.group_id in self._following:
                continue
            node = self._nodes.get(g.group_id)
            if node is None:
                self._missing.setdefault(src, set()).add(g.group_id)
                continue
            if node.quiesce_follower(src, g.term, g.commit):
                self._following[g.group_id] = src
                self._under.setdefault(src, set()).add(g.group_id)
        under = self._under.get(src)
        if under is None:
            return
        for group_id in [g for g in under if g not in listed]:
            self.left(group_id)
            node = self._nodes.get(group_id)
            if node is not None:
                node.wake()
