"""The core's quiescence predicates (RawNode.quiet_leader, peers_recently_active,
quiet_follower, heard_from_leader, expire_election_timer): what the asyncio shell and the
simulator ask before a group stops ticking (consensus/quiesce.py). Each condition is turned
off one at a time."""

from __future__ import annotations

from service.raft import ConfigChangeType, MessageType, NodeId, Role
from service.testing.raft_harness import Cluster


def quiet_group() -> Cluster:
    """Three nodes, `a` leading, one entry committed everywhere, and every follower answered
    a heartbeat since the last quorum check."""
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.propose("a", b"k=1")
    c.tick("a")  # heartbeat_tick 1: a heartbeat round, answered by both
    return c


def test_a_leader_with_everything_replicated_and_answered_is_quiet() -> None:
    c = quiet_group()
    assert c.node("a").quiet_leader()
    assert not c.node("b").quiet_leader()  # a follower never is


def test_a_follower_behind_keeps_the_leader_awake() -> None:
    c = quiet_group()
    c.isolate("c")
    c.propose("a", b"k=2")  # committed by a and b; c never got it
    c.tick("a")
    assert not c.node("a").quiet_leader()
    c.heal()
    c.tick("a")  # the heartbeat answer from c triggers the append
    assert c.node("a").quiet_leader()


def test_an_uncommitted_entry_keeps_the_leader_awake() -> None:
    c = quiet_group()
    c.isolate("b")
    c.isolate("c")
    c.node("a").propose(b"k=2")
    c.stabilize()
    assert c.node("a").raft.log.committed < c.node("a").raft.log.last_index()
    assert not c.node("a").quiet_leader()


def test_a_peer_silent_since_the_last_quorum_check_is_not_recently_active() -> None:
    """recent_active is asked for at the moment of quiescing: a leader woken later then gets
    a whole election timeout before check-quorum counts answers, instead of stepping down on
    flags cleared just before it stopped ticking."""
    c = quiet_group()
    assert c.node("a").peers_recently_active()
    c.msg_filter.append(lambda m: m.type is MessageType.HEARTBEAT_RESP and m.frm == "c")
    c.tick("a", 10)  # a quorum check (election_tick 10) clears every flag; c never answers
    assert c.role("a") is Role.LEADER  # b answered: still a quorum
    assert c.node("a").quiet_leader()  # still quiet: nothing to replicate
    assert not c.node("a").peers_recently_active()
    c.msg_filter.clear()
    c.tick("a")
    assert c.node("a").peers_recently_active()


def test_a_config_change_or_transfer_under_way_keeps_the_leader_awake() -> None:
    c = quiet_group()
    c.isolate("b")
    c.isolate("c")
    node = c.node("a")
    c.change("a", ConfigChangeType.ADD_LEARNER, "d")  # not committed: b and c are cut off
    assert not node.quiet_leader()
    c = quiet_group()
    c.isolate("c")
    c.node("a").transfer_leader(NodeId("c"))
    c.stabilize()
    assert c.node("a").raft.lead_transferee == "c"
    assert not c.node("a").quiet_leader()


def test_a_follower_is_quiet_only_for_its_leader_term_and_whole_log() -> None:
    c = quiet_group()
    b = c.node("b")
    raft = b.raft
    term, commit = raft.term, raft.log.committed
    assert b.quiet_follower(NodeId("a"), term, commit)
    assert not b.quiet_follower(NodeId("c"), term, commit)  # not its leader
    assert not b.quiet_follower(NodeId("a"), term + 1, commit)  # another term
    assert not b.quiet_follower(NodeId("a"), term, commit + 1)  # the leader has more
    assert not c.node("a").quiet_follower(NodeId("a"), term, commit)  # a leader never is


def test_heard_from_leader_restarts_and_expire_ends_the_followers_election_timer() -> None:
    c = quiet_group()
    b = c.node("b")
    for _ in range(5):
        b.tick()
    assert b.raft.election_elapsed == 5
    b.heard_from_leader()
    assert b.raft.election_elapsed == 0
    b.expire_election_timer()
    assert b.raft.election_elapsed == b.raft.opts.election_tick
    a = c.node("a")
    elapsed = a.raft.election_elapsed
    a.expire_election_timer()
    a.heard_from_leader()
    assert a.raft.election_elapsed == elapsed  # a leader's timers are left alone
