"""Tests named after the rules of the Raft paper (Ongaro & Ousterhout 2014), Figure 2 and §5,
plus the Figure 8 scenario. Each drives the real core through the in-memory harness."""

from __future__ import annotations

import dataclasses

import pytest

from service.raft import (
    Entry,
    EntryType,
    MemoryStorage,
    Message,
    MessageType,
    NodeId,
    ProposalDropped,
    RaftConfig,
    RaftOptions,
    RawNode,
    Role,
)
from service.testing.raft_harness import Cluster

# -- Figure 2, "Rules for Servers: All Servers" ---------------------------------------------------


def test_all_servers_higher_term_in_any_message_converts_to_follower() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    a = c.node("a").raft
    term = a.term
    a.step(Message(MessageType.APP_RESP, to=NodeId("a"), frm=NodeId("b"), term=term + 5))
    assert a.state is Role.FOLLOWER
    assert a.term == term + 5
    assert a.lead == "" and a.vote == ""


def test_all_servers_apply_committed_entries_in_log_order() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    for i in range(20):
        c.propose("a", b"k%d=%d" % (i, i))
    for n in "abc":
        idx = [e.index for e in c.nodes[NodeId(n)].applied]
        assert idx == sorted(idx) and idx == list(range(1, len(idx) + 1))
        assert c.committed_data(n) == [b"k%d=%d" % (i, i) for i in range(20)]


# -- Figure 2, "Followers" -------------------------------------------------------------------------


def test_followers_start_election_on_timeout_without_leader() -> None:
    c = Cluster(["a", "b", "c"], seed=3)
    c.tick_all(40)
    assert c.leader() is not None
    terms = {c.node(n).raft.term for n in "abc"}
    assert len(terms) == 1


def test_followers_election_timeout_is_randomized_between_et_and_2et() -> None:
    seen = set()
    for seed in range(50):
        c = Cluster(["a", "b", "c"], seed=seed, election_tick=10)
        t = c.node("a").raft.randomized_election_timeout
        assert 10 <= t < 20
        seen.add(t)
    assert len(seen) > 3


# -- Figure 2, "Candidates" ------------------------------------------------------------------------


def test_candidates_increment_term_and_vote_for_self() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False)
    c.isolate("a")
    c.node("a").campaign()
    c.stabilize()
    r = c.node("a").raft
    assert r.state is Role.CANDIDATE and r.term == 1 and r.vote == "a"


def test_candidates_win_with_majority_of_votes() -> None:
    c = Cluster(["a", "b", "c", "d", "e"], pre_vote=False)
    c.isolate("d")
    c.isolate("e")
    c.elect("a")
    assert c.role("a") is Role.LEADER  # a, b, c form a majority of five


def test_candidates_lose_without_majority() -> None:
    c = Cluster(["a", "b", "c", "d", "e"], pre_vote=False)
    for n in "cde":
        c.isolate(n)
    c.elect("a")
    assert c.role("a") is Role.CANDIDATE


def test_candidates_step_down_on_append_from_new_leader_of_same_term() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False)
    c.elect("a")
    b = c.node("b").raft
    b.become_candidate()  # term 2 on its own
    term = b.term
    b.step(
        Message(MessageType.APP, to=NodeId("b"), frm=NodeId("c"), term=term, index=1, log_term=1)
    )
    assert b.state is Role.FOLLOWER and b.lead == "c"


# -- Figure 2, RequestVote RPC ---------------------------------------------------------------------


def test_request_vote_reply_false_if_term_lower() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False, check_quorum=False)
    c.elect("a")
    c.elect("b")  # term 2
    b = c.node("b").raft
    assert b.term == 2
    c.queue.clear()
    b.step(Message(MessageType.VOTE, to=NodeId("b"), frm=NodeId("c"), term=1, index=10, log_term=9))
    assert b.vote == "b" and b.term == 2  # a stale-term vote request changes nothing
    assert not any(m.type is MessageType.VOTE_RESP and not m.reject for m in b.msgs)


def test_request_vote_grant_only_once_per_term() -> None:
    storage = MemoryStorage()
    n = RawNode(
        RaftOptions(id=NodeId("x"), pre_vote=False, check_quorum=False),
        storage,
        __import__("random").Random(0),
        RaftConfig(frozenset(map(NodeId, "xyz"))),
    )
    n.step(Message(MessageType.VOTE, to=NodeId("x"), frm=NodeId("y"), term=5))
    n.step(Message(MessageType.VOTE, to=NodeId("x"), frm=NodeId("z"), term=5))
    rd = n.ready()
    votes = [(m.to, m.reject) for m in rd.messages if m.type is MessageType.VOTE_RESP]
    assert votes == [("y", False), ("z", True)]
    assert rd.hard_state is not None and rd.hard_state.vote == "y" and rd.must_sync


def test_request_vote_refused_if_candidate_log_not_up_to_date() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False, check_quorum=False)
    c.elect("a")
    c.propose("a", b"x=1")
    c.isolate("c")
    c.propose("a", b"x=2")  # c misses this
    c.heal()
    c.isolate("a")
    # c's log is behind b's: b refuses (§5.4.1), so c cannot win with b's vote.
    c.node("c").campaign()
    c.stabilize()
    assert c.role("c") is not Role.LEADER
    resp = [m for m in c.delivered if m.type is MessageType.VOTE_RESP and m.frm == "b"]
    assert resp and resp[-1].reject


def test_vote_persisted_before_response_is_sent() -> None:
    """The Ready that carries a vote response carries the hard state with the vote and
    must_sync, so a caller following the contract fsyncs before the response leaves."""
    storage = MemoryStorage()
    import random

    n = RawNode(
        RaftOptions(id=NodeId("x"), pre_vote=False),
        storage,
        random.Random(0),
        RaftConfig(frozenset(map(NodeId, "xy"))),
    )
    n.step(Message(MessageType.VOTE, to=NodeId("x"), frm=NodeId("y"), term=3))
    rd = n.ready()
    assert any(m.type is MessageType.VOTE_RESP and not m.reject for m in rd.messages)
    assert rd.hard_state is not None and (rd.hard_state.term, rd.hard_state.vote) == (3, "y")
    assert rd.must_sync


# -- Figure 2, AppendEntries RPC -------------------------------------------------------------------


def _follower(entries: list[tuple[int, int]], commit: int = 0) -> RawNode:
    import random

    s = MemoryStorage()
    s.append([Entry(term=t, index=i) for i, t in entries])
    from service.raft import HardState

    s.set_hard_state(HardState(term=max([t for _, t in entries], default=0), commit=commit))
    return RawNode(
        RaftOptions(id=NodeId("f")), s, random.Random(1), RaftConfig(frozenset(map(NodeId, "fl")))
    )


def _append(
    n: RawNode, term: int, prev: int, prev_term: int, ents: list[tuple[int, int]], commit: int = 0
) -> Message:
    n.step(
        Message(
            MessageType.APP,
            to=NodeId("f"),
            frm=NodeId("l"),
            term=term,
            index=prev,
            log_term=prev_term,
            commit=commit,
            entries=tuple(Entry(term=t, index=i) for i, t in ents),
        )
    )
    rd = n.ready()
    n.raft.log.storage.append(rd.entries)  # type: ignore[attr-defined]
    n.advance(rd)
    return next(m for m in rd.messages if m.type is MessageType.APP_RESP)


def test_append_entries_reply_false_if_log_lacks_prev_entry() -> None:
    n = _follower([(1, 1), (2, 1)])
    resp = _append(n, 2, 3, 1, [(4, 2)])
    assert resp.reject and resp.index == 3 and resp.reject_hint == 2


def test_append_entries_reply_false_if_prev_term_mismatch() -> None:
    n = _follower([(1, 1), (2, 1), (3, 1)])
    resp = _append(n, 3, 3, 2, [(4, 3)])
    assert resp.reject


def test_append_entries_conflicting_entry_deletes_it_and_all_that_follow() -> None:
    n = _follower([(1, 1), (2, 1), (3, 1), (4, 1)])
    resp = _append(n, 2, 1, 1, [(2, 2)])
    assert not resp.reject
    log = n.raft.log
    assert log.last_index() == 2 and log.term(2) == 2


def test_append_entries_existing_entries_not_truncated_by_stale_append() -> None:
    n = _follower([(1, 1), (2, 1), (3, 1)])
    resp = _append(n, 1, 0, 0, [(1, 1)])  # a delayed duplicate of an old append
    assert not resp.reject and n.raft.log.last_index() == 3


def test_append_entries_commit_is_min_of_leader_commit_and_last_new_entry() -> None:
    n = _follower([(1, 1)])
    _append(n, 1, 1, 1, [(2, 1)], commit=10)
    assert n.raft.log.committed == 2


# -- Figure 2, "Leaders" ---------------------------------------------------------------------------


def test_leaders_send_heartbeats_each_heartbeat_interval() -> None:
    c = Cluster(["a", "b", "c"], heartbeat_tick=2)
    c.elect("a")
    c.delivered.clear()
    c.tick("a", 4)
    beats = [m for m in c.delivered if m.type is MessageType.HEARTBEAT]
    assert len(beats) == 4  # two rounds to two followers


def test_leaders_append_noop_of_their_term_on_election() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    log = c.node("a").raft.log
    e = log.slice(log.last_index(), log.last_index() + 1)[0]
    assert e.term == c.node("a").raft.term and e.data == b"" and e.type is EntryType.NORMAL
    assert log.committed == log.last_index()


def test_leaders_retry_with_decremented_next_index_until_logs_match() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.isolate("c")
    for i in range(30):
        c.propose("a", b"k=%d" % i)
    c.heal()
    c.tick("a", 2)
    assert c.committed_data("c") == c.committed_data("a")


def _cluster_from_logs(logs: dict[str, list[int]], term: int) -> Cluster:
    """A cluster whose nodes start with the given logs (list of terms, index 1..n)."""
    from service.raft import HardState

    c = Cluster(list(logs), pre_vote=False, check_quorum=False, max_size_per_msg=1)
    for i, (n, terms) in enumerate(logs.items()):
        s = MemoryStorage()
        s.append([Entry(term=t, index=k + 1, data=b"t=%d" % t) for k, t in enumerate(terms)])
        s.set_hard_state(HardState(term=term, commit=1))
        c.nodes[NodeId(n)] = c._new_node(NodeId(n), s, i, c.config)
    return c


def test_figure8_old_term_entry_on_majority_is_not_committed_and_may_be_overwritten() -> None:
    """Figure 8 (c)-(d): s1, leader of term 4, has replicated its term-2 entry at index 2 to a
    majority, but must not count it as committed; s5 (term-3 entry at index 2) may still be
    elected and overwrite it, and no node ever applies the term-2 entry."""
    c = _cluster_from_logs({"s1": [1, 2], "s2": [1, 2], "s3": [1], "s4": [1], "s5": [1, 3]}, term=3)
    # s1 may replicate index 2 but nothing of its own term: strip entries >= 3 in flight.
    c.msg_transform.append(
        lambda m: dataclasses.replace(m, entries=tuple(e for e in m.entries if e.index < 3))
    )
    c.isolate("s5")  # s5 hears nothing from s1 in term 4, as in the figure
    c.elect("s1")
    s1 = c.node("s1").raft
    assert s1.state is Role.LEADER and s1.term == 4
    holders = [n for n in c.ids if c.node(n).raft.log.match_term(2, 2)]
    assert len(holders) >= 3  # on a majority...
    assert all(c.node(n).raft.log.committed == 1 for n in c.ids)  # ...yet not committed
    # (d) s1 crashes; s5 wins term 5 (its last term 3 beats everyone's 2) and overwrites.
    c.down.add(NodeId("s1"))
    c.msg_transform.clear()
    c.heal()
    c.elect("s5")  # term 4: everyone already voted for s1 in term 4
    c.elect("s5")  # term 5
    assert c.role("s5") is Role.LEADER
    c.propose("s5", b"after=1")
    for n in ["s2", "s3", "s4", "s5"]:
        applied = {e.index: e.term for e in c.nodes[NodeId(n)].applied}
        assert applied[2] == 3, n
    assert all(e.term != 2 for n in c.ids for e in c.nodes[n].applied)


def test_figure8_entry_of_current_term_commits_earlier_entries() -> None:
    """Figure 8 (e): once s1 replicates an entry of its own term on a majority, that entry
    and the term-2 entry before it are committed, and s5 can no longer win."""
    c = _cluster_from_logs({"s1": [1, 2], "s2": [1, 2], "s3": [1], "s4": [1], "s5": [1, 3]}, term=3)
    c.isolate("s5")
    c.elect("s1")
    s1 = c.node("s1").raft
    assert s1.log.committed == 3 and s1.log.term(2) == 2
    c.heal()
    c.down.add(NodeId("s1"))
    c.node("s5").campaign()
    c.stabilize()
    assert c.role("s5") is not Role.LEADER


def test_figure8_leader_does_not_commit_old_term_entry_by_counting() -> None:
    """The essential rule in isolation: matchIndex on a majority for an old-term entry does
    not advance commit."""
    import random

    s = MemoryStorage()
    s.append([Entry(term=1, index=1), Entry(term=2, index=2)])
    from service.raft import HardState

    s.set_hard_state(HardState(term=3, vote=NodeId("a"), commit=1))
    n = RawNode(
        RaftOptions(id=NodeId("a"), pre_vote=False),
        s,
        random.Random(0),
        RaftConfig(frozenset(map(NodeId, "abc"))),
    )
    r = n.raft
    r.become_candidate()
    r.become_leader()  # term 4, no-op at index 3
    assert r.log.last_index() == 3
    r.step(Message(MessageType.APP_RESP, to=NodeId("a"), frm=NodeId("b"), term=r.term, index=2))
    assert r.log.committed == 1  # index 2 (term 2) is on a majority but not committed
    r.step(Message(MessageType.APP_RESP, to=NodeId("a"), frm=NodeId("b"), term=r.term, index=3))
    assert r.log.committed == 1  # b has index 3, but the leader's own copy is not durable yet
    r.on_persisted(3)  # the caller's advance() after the fsync
    assert r.log.committed == 3


# -- §5.4 safety ---------------------------------------------------------------------------------


def test_leader_completeness_new_leader_has_all_committed_entries() -> None:
    c = Cluster(["a", "b", "c", "d", "e"])
    c.elect("a")
    for i in range(10):
        c.propose("a", b"k=%d" % i)
    committed = c.node("a").raft.log.committed
    c.down.add(NodeId("a"))
    c.tick_all(60)
    new = c.leader()
    assert new is not None and new != "a"
    log = c.node(new).raft.log
    assert log.last_index() >= committed
    assert c.committed_data(new)[:10] == [b"k=%d" % i for i in range(10)]


def test_follower_refuses_proposals_with_leader_hint() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    with pytest.raises(ProposalDropped) as e:
        c.node("b").propose(b"x=1")
    assert e.value.leader == "a"
