"""Coalescing a Ready's messages (coalesce.py) and the contract the asyncio shell's pipelining
relies on: the core may be stepped between `ready()` and `advance()`, and what that produces
only leaves with the next Ready."""

from __future__ import annotations

import random

from service.raft import (
    Entry,
    MemoryStorage,
    Message,
    MessageType,
    NodeId,
    RaftConfig,
    RaftOptions,
    RawNode,
    Ready,
)
from service.raft.coalesce import coalesce
from service.testing.raft_harness import Cluster

A, B, C = NodeId("a"), NodeId("b"), NodeId("c")
APP, APP_RESP = MessageType.APP, MessageType.APP_RESP


def ents(term: int, *indexes: int, size: int = 1) -> tuple[Entry, ...]:
    return tuple(Entry(term, i, data=b"x" * size) for i in indexes)


def app(to: str, index: int, entries: tuple[Entry, ...], commit: int, term: int = 2) -> Message:
    return Message(
        APP, to=NodeId(to), frm=A, term=term, index=index, log_term=term, entries=entries,
        commit=commit,
    )  # fmt: skip


def ack(to: str, index: int, term: int = 2, reject: bool = False, frm: str = "b") -> Message:
    return Message(APP_RESP, to=NodeId(to), frm=NodeId(frm), term=term, index=index, reject=reject)


# -- coalesce() --------------------------------------------------------------------------------


def test_contiguous_appends_to_a_peer_become_one() -> None:
    out = coalesce([app("b", 4, ents(2, 5, 6), 3), app("b", 6, ents(2, 7), 5)], 1 << 20)
    assert out == [app("b", 4, ents(2, 5, 6, 7), 5)]


def test_a_commit_only_append_merges_with_the_next_batch() -> None:
    out = coalesce([app("b", 6, (), 6), app("b", 6, ents(2, 7, 8), 6)], 1 << 20)
    assert out == [app("b", 6, ents(2, 7, 8), 6)]
    # ... and one carrying entries absorbs a later commit-only one.
    out = coalesce([app("b", 6, ents(2, 7), 6), app("b", 7, (), 7)], 1 << 20)
    assert out == [app("b", 6, ents(2, 7), 7)]


def test_appends_to_different_peers_merge_per_peer_in_order() -> None:
    msgs = [
        app("b", 4, ents(2, 5), 4),
        app("c", 2, ents(2, 3, 4, 5), 4),
        app("b", 5, ents(2, 6), 5),
        app("c", 5, ents(2, 6), 5),
    ]
    assert coalesce(msgs, 1 << 20) == [
        app("b", 4, ents(2, 5, 6), 5),
        app("c", 2, ents(2, 3, 4, 5, 6), 5),
    ]


def test_appends_that_do_not_connect_or_differ_in_term_stay_apart() -> None:
    gap = [app("b", 4, ents(2, 5), 4), app("b", 6, ents(2, 7), 4)]  # 6 is not where 5 ends
    assert coalesce(gap, 1 << 20) == gap
    again = [app("b", 4, ents(2, 5, 6), 4), app("b", 4, ents(2, 5, 6), 4)]  # a re-send
    assert coalesce(again, 1 << 20) == again
    terms = [app("b", 4, ents(2, 5), 4), app("b", 5, ents(3, 6), 4, term=3)]
    assert coalesce(terms, 1 << 20) == terms


def test_a_merge_never_exceeds_the_message_size_limit() -> None:
    big = [app("b", 4, ents(2, 5, size=600), 4), app("b", 5, ents(2, 6, size=600), 4)]
    assert coalesce(big, 1000) == big  # 2 x (600 + 24) > 1000: two messages, as cut
    assert coalesce(big, 2000) == [app("b", 4, ents(2, 5, 6, size=600), 4)]


def test_another_message_to_the_peer_in_between_keeps_appends_apart() -> None:
    hb = Message(MessageType.HEARTBEAT, to=B, frm=A, term=2, commit=4)
    msgs = [app("b", 4, ents(2, 5), 4), hb, app("b", 5, ents(2, 6), 4)]
    assert coalesce(msgs, 1 << 20) == msgs


def test_superseded_acknowledgements_are_dropped_but_rejections_kept() -> None:
    assert coalesce([ack("a", 5), ack("a", 7), ack("a", 9)], 1 << 20) == [ack("a", 9)]
    with_reject = [ack("a", 5), ack("a", 7, reject=True), ack("a", 9)]
    assert coalesce(with_reject, 1 << 20) == with_reject
    stale_term = [ack("a", 5, term=2), ack("a", 7, term=3)]
    assert coalesce(stale_term, 1 << 20) == stale_term
    backwards = [ack("a", 7), ack("a", 5)]  # not an improvement: keep both, as sent
    assert coalesce(backwards, 1 << 20) == backwards


# -- through RawNode ---------------------------------------------------------------------------


def test_proposals_stepped_between_readys_go_out_as_one_append_per_follower() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    leader = c.node("a")
    for i in range(5):
        leader.propose(b"k%d=%d" % (i, i))  # five proposals, five broadcasts in the core
    rd = leader.ready()
    apps = [m for m in rd.messages if m.type is APP]
    assert sorted(m.to for m in apps) == [B, C]
    assert all(len(m.entries) == 5 for m in apps)


def _follower() -> tuple[RawNode, MemoryStorage]:
    storage = MemoryStorage()
    config = RaftConfig(frozenset({A, B, C}))
    return RawNode(RaftOptions(id=B), storage, random.Random(0), config), storage


def _persist(storage: MemoryStorage, rd: Ready) -> None:
    storage.append(rd.entries)
    if rd.hard_state is not None:
        storage.set_hard_state(rd.hard_state)


def test_a_follower_stepped_during_a_persist_acknowledges_only_what_is_durable() -> None:
    node, storage = _follower()
    first = Message(APP, to=B, frm=A, term=1, index=0, log_term=0, entries=ents(1, 1, 2))
    node.step(first)
    rd1 = node.ready()
    assert [e.index for e in rd1.entries] == [1, 2]
    assert [(m.type, m.index) for m in rd1.messages] == [(APP_RESP, 2)]
    # More entries arrive while rd1 is being persisted: nothing about them leaves yet.
    second = Message(APP, to=B, frm=A, term=1, index=2, log_term=1, entries=ents(1, 3, 4), commit=2)
    node.step(second)
    _persist(storage, rd1)
    node.advance(rd1)
    rd2 = node.ready()
    assert [e.index for e in rd2.entries] == [3, 4]  # not 1, 2 again
    assert [e.index for e in rd2.committed_entries] == [1, 2]  # durable since rd1
    assert [(m.type, m.index) for m in rd2.messages] == [(APP_RESP, 4)]  # after rd2 persists
    _persist(storage, rd2)
    node.advance(rd2)
    assert not node.has_ready()


def test_an_overwrite_during_a_persist_rewrites_only_the_replaced_suffix() -> None:
    """Entries 1-3 (commit 2) are being persisted when a new leader replaces entry 3. The next
    Ready must write entry 3 only: entries 1 and 2 are durable and unchanged, and writing them
    again would reach below the commit index persisted with them (the WAL refuses that)."""
    node, storage = _follower()
    node.step(Message(APP, to=B, frm=A, term=1, index=0, log_term=0, entries=ents(1, 1, 2, 3)))
    node.step(Message(APP, to=B, frm=A, term=1, index=3, log_term=1, commit=2))
    rd1 = node.ready()
    assert [e.index for e in rd1.entries] == [1, 2, 3]
    assert rd1.hard_state is not None and rd1.hard_state.commit == 2
    # A new leader (term 2) replaces entry 3 before rd1 is durable.
    node.step(Message(APP, to=B, frm=C, term=2, index=2, log_term=1, entries=ents(2, 3)))
    _persist(storage, rd1)
    node.advance(rd1)  # the old entry 3 is durable, but no longer the log's: not acknowledged
    rd2 = node.ready()
    assert [(e.index, e.term) for e in rd2.entries] == [(3, 2)]
    assert rd2.hard_state is not None and rd2.hard_state.term == 2
    assert [(m.to, m.type, m.index) for m in rd2.messages] == [(C, APP_RESP, 3)]
    assert not rd2.send_before_persist  # a new term: the reply waits for the disk
    _persist(storage, rd2)
    node.advance(rd2)
    assert [storage.term(i) for i in (1, 2, 3)] == [1, 1, 2]
    assert not node.has_ready()


def test_a_leader_commits_on_acks_stepped_during_its_own_persist() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    leader = c.node("a")
    index, _ = leader.propose(b"k=v")
    rd = leader.ready()
    assert rd.send_before_persist and [e.index for e in rd.entries] == [index]
    # Both followers acknowledge before the leader's own write is done: a quorum without it.
    for f in (B, C):
        leader.step(ack("a", index, term=leader.raft.term, frm=f))
    assert leader.raft.log.committed == index
    c.nodes[A].storage.append(rd.entries)
    leader.advance(rd)
    rd2 = leader.ready()
    assert [e.index for e in rd2.committed_entries] == [index]  # applied only now, durable
    commit_apps = [m for m in rd2.messages if m.type is APP]
    assert {m.to for m in commit_apps} == {B, C} and all(m.commit == index for m in commit_apps)
