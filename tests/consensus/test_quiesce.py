"""Quiescence (service/consensus/quiesce.py): idle groups stop ticking and heartbeating.

The registry's rules are tested with fake nodes, a fake transport and a manual clock. The
RaftNode side runs three real nodes (real WALs in tmp_path) over test_node.py's in-memory
network (tests/helpers/raft_node.py), each with its own `Quiescence`, whose digests travel over
the same network.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from service.consensus.node import NodeSettings
from service.consensus.quiesce import Quiescence
from service.pb import consensus_pb2 as pb
from service.raft import Message, MessageType, Role
from tests.helpers.raft_node import (
    Cluster,
    MemSender,
    eventually,
    run,
)

# --- the registry, with fakes -----------------------------------------------------------------


@dataclass
class FakeNode:
    group_id: str
    peers: tuple[str, ...]
    accepts: bool = True
    quiesced: bool = False
    woken: list[bool] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)

    def members(self) -> Iterable[str]:
        return self.peers

    def quiesce_follower(self, leader: str, term: int, commit: int) -> bool:
        if self.accepts:
            self.quiesced = True
        return self.accepts

    def wake(self, *, leader_suspect: bool = False) -> None:
        self.quiesced = False
        self.woken.append(leader_suspect)

    def peer_lost(self, peer: str) -> None:
        self.lost.append(peer)
        self.wake()


class FakeSender:
    def __init__(self) -> None:
        self.sent: dict[str, list[pb.QuiesceDigest]] = {}

    def send_digest(self, peer: str, digest: pb.QuiesceDigest) -> None:
        self.sent.setdefault(peer, []).append(digest)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def registry() -> tuple[Quiescence, FakeSender, Clock]:
    sender, clock = FakeSender(), Clock()
    return Quiescence(sender, interval_s=0.5, election_timeout_s=1.5, clock=clock), sender, clock


def digest(*groups: tuple[str, int, int]) -> pb.QuiesceDigest:
    d = pb.QuiesceDigest()
    for g, term, commit in groups:
        d.groups.add(group_id=g, term=term, commit=commit)
    return d


def test_a_digest_goes_to_every_peer_and_lists_the_groups_it_shares_with_it() -> None:
    q, sender, _ = registry()
    q.register(FakeNode("t1", ("b", "c")))
    q.register(FakeNode("t2", ("c", "d")))
    q.register(FakeNode("t3", ("d",)))
    q.lead("t1", term=3, commit=7, members=("b", "c"))
    q.lead("t2", term=5, commit=9, members=("c", "d"))
    q.send_digests()
    listed = {
        peer: sorted((g.group_id, g.term, g.commit) for g in ds[0].groups)
        for peer, ds in sender.sent.items()
    }
    assert listed == {
        "b": [("t1", 3, 7)],
        "c": [("t1", 3, 7), ("t2", 5, 9)],
        "d": [("t2", 5, 9)],  # and t3, which this server does not lead: nothing listed
    }
    q.left("t1")
    q.send_digests()
    assert list(sender.sent["b"][1].groups) == []  # still sent: it is b's liveness signal


def test_a_follower_quiesces_on_its_leaders_digest_and_wakes_when_left_out() -> None:
    q, _, _ = registry()
    t1, t2, t3 = FakeNode("t1", ("a",)), FakeNode("t2", ("a",)), FakeNode("t3", ("a",), False)
    for n in (t1, t2, t3):
        q.register(n)
    q.on_digest("a", digest(("t1", 2, 4), ("t2", 2, 6), ("t3", 2, 1), ("unknown", 1, 1)))
    assert (t1.quiesced, t2.quiesced, t3.quiesced) == (True, True, False)
    assert q.following == 2
    q.on_digest("a", digest(("t1", 2, 4)))  # t2's leader woke up (or lost its leadership)
    assert t2.woken == [False] and not t2.quiesced and t1.quiesced and t1.woken == []
    q.on_digest("b", digest())  # another leader's digest touches only its own groups
    assert t1.quiesced and q.following == 1


def test_a_server_without_a_listed_group_says_so_and_its_leader_wakes_it() -> None:
    """Server b lost its replica of t1 while t1's leader, here on a, slept: b answers a's
    digest with `not_hosted`, and a wakes t1 with b counted as not heard from. A group a does
    not lead, or a server that is not a member, wakes nothing."""
    a, a_sent, _ = registry()
    b, b_sent, _ = registry()
    t1, t2 = FakeNode("t1", ("b", "c")), FakeNode("t2", ("c",))
    a.register(t1)
    a.register(t2)
    t1.quiesced = t2.quiesced = True
    a.lead("t1", term=3, commit=7, members=("b", "c"))
    a.lead("t2", term=3, commit=7, members=("c",))
    b.register(FakeNode("t9", ("a",)))  # b hosts another group with a, not t1
    a.send_digests()
    b.on_digest("a", a_sent.sent["b"][-1])
    b.send_digests()
    answer = b_sent.sent["a"][-1]
    assert list(answer.not_hosted) == ["t1"]
    b.send_digests()
    assert list(b_sent.sent["a"][-1].not_hosted) == []  # said once per digest received
    a.on_digest("b", answer)
    assert t1.lost == ["b"] and not t1.quiesced and a.leading == 1
    assert a.lost_replicas == 1
    # t2 does not have b as a member: b's word about it is not taken.
    a.on_digest("b", pb.QuiesceDigest(not_hosted=["t2"]))
    assert t2.quiesced and t2.lost == []
    # A server that hosts nothing answers too (its digest to a exists only for this).
    empty, empty_sent, _ = registry()
    empty.on_digest("a", a_sent.sent["b"][-1])
    empty.send_digests()
    assert list(empty_sent.sent["a"][-1].not_hosted) == ["t1"]


def test_a_silent_leader_server_wakes_its_followers_as_suspects() -> None:
    q, _, clock = registry()
    t1, t2 = FakeNode("t1", ("a",)), FakeNode("t2", ("b",))
    q.register(t1)
    q.register(t2)
    q.on_digest("a", digest(("t1", 1, 1)))
    q.on_digest("b", digest(("t2", 1, 1)))
    clock.now += 1.0
    q.on_digest("b", digest(("t2", 1, 1)))
    q.check_leaders(clock.now)
    assert t1.quiesced and t2.quiesced  # a has been silent 1.0 s < 1.5 s
    clock.now += 0.6
    q.check_leaders(clock.now)
    assert t1.woken == [True] and not t1.quiesced  # a: 1.6 s without a digest
    assert t2.quiesced and t2.woken == []  # b spoke 0.6 s ago
    assert q.woken_by_silence == 1 and q.following == 1


def test_an_unreachable_peer_wakes_the_groups_led_here_with_it() -> None:
    q, _, _ = registry()
    t1, t2 = FakeNode("t1", ("b", "c")), FakeNode("t2", ("c", "d"))
    for n in (t1, t2):
        q.register(n)
        n.quiesced = True
    q.lead("t1", 1, 1, ("b", "c"))
    q.lead("t2", 1, 1, ("c", "d"))
    q.peer_unreachable("b")
    assert t1.woken == [False] and t2.woken == [] and q.leading == 1
    q.peer_unreachable("c")
    assert t2.woken == [False] and q.leading == 0


def test_an_unregistered_group_leaves_the_digest_and_the_followers() -> None:
    q, sender, _ = registry()
    q.register(FakeNode("t1", ("b",)))
    q.lead("t1", 1, 1, ("b",))
    q.unregister("t1")
    q.send_digests()
    assert sender.sent == {} and q.leading == 0


# --- three RaftNodes ----------------------------------------------------------------------------

QUIET = NodeSettings(
    tick_interval_s=0.01,
    heartbeat_ticks=2,
    election_ticks=10,
    election_jitter_ticks=10,
    quiesce_ticks=6,
)


class DigestSender(MemSender):
    """MemSender that also carries digests, to the receiving node's registry."""

    def __init__(self, c: QuietCluster, uuid: str) -> None:
        super().__init__(c.net, uuid)
        self.c = c

    def send_digest(self, peer: str, digest: pb.QuiesceDigest) -> None:
        def deliver() -> None:
            q = self.c.registries.get(peer)
            if q is not None and self.net.linked(self.uuid, peer) and peer in self.net.nodes:
                q.on_digest(self.uuid, digest)
            elif (own := self.c.registries.get(self.uuid)) is not None:
                own.peer_unreachable(peer)  # as GrpcTransport reports a failed send

        asyncio.get_running_loop().call_soon(deliver)


class QuietCluster(Cluster):
    def __init__(self, base: Path, settings: NodeSettings = QUIET) -> None:
        super().__init__(base, settings)
        self.registries: dict[str, Quiescence] = {}
        self.senders: dict[str, DigestSender] = {}

    def sender(self, uuid: str) -> MemSender:
        sender = self.senders[uuid] = DigestSender(self, uuid)
        return sender

    async def quiescence(self, uuid: str) -> Quiescence:
        q = self.registries[uuid] = Quiescence(
            self.senders[uuid], interval_s=0.02, election_timeout_s=0.1
        )
        await q.start()
        return q

    async def stop(self, uuid: str) -> None:
        await super().stop(uuid)
        await self.registries.pop(uuid).aclose()

    def sent(self) -> int:
        return sum(s.sent for s in self.senders.values())


def run_quiet(tmp_path: Path, scenario: Callable[[QuietCluster], Awaitable[None]]) -> None:
    run(tmp_path, scenario, settings=QUIET, cluster=QuietCluster)


def all_quiesced(c: Cluster) -> bool:
    return all(n.quiesced for n in c.nodes.values())


def test_an_idle_group_quiesces_sends_nothing_and_wakes_for_a_write(tmp_path: Path) -> None:
    async def scenario(c: QuietCluster) -> None:
        leader = await c.leader()
        await leader.propose(b"k=1", timeout=5)
        await eventually(lambda: all_quiesced(c), "leader and followers quiesce")
        sent, ticks = c.sent(), leader.raw.raft.tick_count
        await asyncio.sleep(0.5)  # 50 ticks, 25 heartbeat intervals of 10 ms each
        assert c.sent() == sent, "a quiesced group sends no Raft messages"
        assert leader.raw.raft.tick_count == ticks, "a quiesced leader does not tick"
        assert leader.status().role is Role.LEADER

        assert await leader.propose(b"k=2", timeout=5) == leader.applied  # wakes, commits
        await eventually(
            lambda: all(sm.kv.get("k") == "2" for sm in c.sms.values()), "applied everywhere"
        )
        await eventually(lambda: all_quiesced(c), "quiesces again once idle")
        assert all(n.status().role is Role.FOLLOWER for n in c.followers(leader))

    run_quiet(tmp_path, scenario)


def test_followers_of_a_dead_quiesced_leader_elect_another(tmp_path: Path) -> None:
    async def scenario(c: QuietCluster) -> None:
        leader = await c.leader()
        await leader.propose(b"k=1", timeout=5)
        await eventually(lambda: all_quiesced(c), "the group quiesces")
        term = leader.status().term
        started = time.monotonic()
        await c.stop(leader.uuid)  # its server is gone: no more digests from it
        new = await c.leader()
        assert new.status().term > term
        assert sum(q.woken_by_silence for q in c.registries.values()) == 2
        await new.propose(b"k=2", timeout=5)
        # Silence (0.1 s) + jitter: well within the 15 s limit of `leader`; logged for a look.
        print(f"new leader after {time.monotonic() - started:.2f}s")

    run_quiet(tmp_path, scenario)


def test_a_follower_cut_off_from_a_quiesced_leader_cannot_depose_it(tmp_path: Path) -> None:
    """Leader stickiness survives quiescence: the other follower still hears the leader's
    digests, so it refuses the cut-off follower's pre-votes and the term never moves."""

    async def scenario(c: QuietCluster) -> None:
        leader = await c.leader()
        await leader.propose(b"k=1", timeout=5)
        await eventually(lambda: all_quiesced(c), "the group quiesces")
        lonely, other = c.followers(leader)
        term = leader.status().term
        c.net.cut(leader.uuid, lonely.uuid)
        await eventually(lambda: not lonely.quiesced, "the cut-off follower wakes")
        await asyncio.sleep(0.5)  # several election timeouts of pre-votes
        assert leader.status().role is Role.LEADER and leader.status().term == term
        assert other.status().term == term
        c.net.heal()
        await leader.propose(b"k=2", timeout=5)
        await eventually(lambda: c.sms[lonely.uuid].kv.get("k") == "2", "it catches up")

    run_quiet(tmp_path, scenario)


def test_late_heartbeat_answers_do_not_wake_a_quiesced_leader(tmp_path: Path) -> None:
    async def scenario(c: QuietCluster) -> None:
        leader = await c.leader()
        await eventually(lambda: leader.quiesced, "the leader quiesces")
        term = leader.status().term
        follower = c.followers(leader)[0]
        answer = Message(MessageType.HEARTBEAT_RESP, to=leader.uuid, frm=follower.uuid, term=term)
        leader.step([answer])
        assert leader.quiesced
        leader.step([Message(MessageType.APP_RESP, to=leader.uuid, frm=follower.uuid, term=term)])
        assert not leader.quiesced  # anything else is work: tick again

    run_quiet(tmp_path, scenario)


def test_a_quiet_stretch_longer_than_an_election_timeout_still_quiesces(tmp_path: Path) -> None:
    """Every quorum check clears the peers' recent_active flags, so a leader that needed them
    throughout its quiet stretch could never quiesce once the stretch outlasts an election
    timeout (the tests' tserver timing: 20 quiet ticks, 10 election ticks). They are asked
    for only at the moment of quiescing."""
    long_quiet = dataclasses.replace(QUIET, quiesce_ticks=3 * QUIET.election_ticks)

    async def scenario(c: QuietCluster) -> None:
        leader = await c.leader()
        await leader.propose(b"k=1", timeout=5)
        await eventually(lambda: all_quiesced(c), "leader and followers quiesce")

    run(tmp_path, scenario, settings=long_quiet, cluster=QuietCluster)


def test_a_quiesced_leader_whose_followers_died_wakes_and_steps_down(tmp_path: Path) -> None:
    """Its digests to the dead followers' servers fail, which wakes the group it leads with
    them; awake, check-quorum finds no quorum and it steps down (asleep it would have stayed
    a leader nobody follows, and told its master so)."""

    async def scenario(c: QuietCluster) -> None:
        leader = await c.leader()
        await leader.propose(b"k=1", timeout=5)
        await eventually(lambda: all_quiesced(c), "the group quiesces")
        for f in c.followers(leader):
            await c.stop(f.uuid)
        await eventually(lambda: not leader.quiesced, "the leader wakes")
        await eventually(lambda: leader.status().role is not Role.LEADER, "it steps down")

    run_quiet(tmp_path, scenario)
