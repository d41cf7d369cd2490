"""Pre-vote, check-quorum, membership changes (docs/design/consensus.md#R4), ReadIndex and leases,
leadership transfer, snapshots and flow control: each rule exercised on the real core."""

from __future__ import annotations

import pytest

from service.raft import (
    ConfigChange,
    ConfigChangeRefused,
    ConfigChangeType,
    Message,
    MessageType,
    NodeId,
    ProposalDropped,
    Role,
)
from service.testing.raft_harness import Cluster, encode_kv

# -- pre-vote and check-quorum (thesis §9.6, §6.2) --------------------------------------------


def test_prevote_partitioned_node_does_not_inflate_its_term() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=True)
    c.elect("a")
    c.isolate("c")
    c.tick("c", 100)
    assert c.node("c").raft.term == c.node("a").raft.term
    c.heal()
    c.tick_all(5)
    assert c.leader() == "a"  # rejoining did not depose the healthy leader


def test_without_prevote_partitioned_node_disrupts_on_rejoin() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False, check_quorum=False)
    c.elect("a")
    c.isolate("c")
    c.tick("c", 100)
    assert c.node("c").raft.term > c.node("a").raft.term  # the problem pre-vote solves


def test_check_quorum_leader_steps_down_when_isolated() -> None:
    c = Cluster(["a", "b", "c"], check_quorum=True)
    c.elect("a")
    c.isolate("a")
    c.tick("a", 25)
    assert c.role("a") is Role.FOLLOWER


def test_leader_stickiness_follower_ignores_votes_while_leader_alive() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False, check_quorum=True)
    c.elect("a")
    term = c.node("a").raft.term
    c.isolate("a")
    c.cut -= {(NodeId("a"), NodeId("b")), (NodeId("b"), NodeId("a"))}  # a still reaches b
    c.node("c").campaign()
    c.stabilize()
    assert c.node("b").raft.term == term  # b ignored c's vote request: it has a live leader
    assert c.leader() == "a"


# -- membership: one server at a time, learners first, compare-and-set -------------------------
# (docs/design/consensus.md#R4)


def test_add_learner_catches_up_then_promote_to_voter() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    for i in range(10):
        c.propose("a", b"k=%d" % i)
    c.add_node("d")
    c.change("a", ConfigChangeType.ADD_LEARNER, "d")
    c.tick("a", 2)
    assert c.role("d") is Role.LEARNER
    assert c.committed_data("d") == c.committed_data("a")
    assert c.node("a").raft.config.quorum() == 2  # learners do not count
    c.change("a", ConfigChangeType.PROMOTE, "d")
    c.tick("a", 2)
    assert c.role("d") is Role.FOLLOWER
    assert c.node("a").raft.config.voters == {"a", "b", "c", "d"}
    assert c.node("a").raft.config.quorum() == 3


def test_a_node_outside_the_bootstrap_config_is_sent_a_snapshot_not_the_log() -> None:
    """The bootstrap config is not a log entry. A node that joins later and replayed the log
    from index 1 would apply ADD_LEARNER/PROMOTE of itself onto an empty config and believe it
    is the only voter (a quorum of one: it could elect itself). When the leader has a snapshot,
    such a node is sent the snapshot, which carries the config, and agrees with the leader."""
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    for i in range(10):
        c.propose("a", b"k=%d" % i)
    a = c.nodes[NodeId("a")]  # a snapshot exists, and the whole log is still there
    a.storage.create_snapshot(a.node.raft.log.applied, a.applied_config, encode_kv(a.kv))
    assert a.node.raft.log.first_index() == 1
    c.add_node("d")
    c.change("a", ConfigChangeType.ADD_LEARNER, "d")
    c.tick("a", 2)
    assert [m for m in c.delivered if m.type is MessageType.SNAP and m.to == "d"]
    c.change("a", ConfigChangeType.PROMOTE, "d")
    c.tick("a", 2)
    assert c.node("d").raft.config.voters == c.node("a").raft.config.voters == {"a", "b", "c", "d"}
    assert c.node("d").raft.config.quorum() == 3
    assert c.nodes[NodeId("d")].kv == c.nodes[NodeId("a")].kv
    # A bootstrap member that lags is still sent the log, not a snapshot.
    c.isolate("c")
    c.propose("a", b"x=1")
    c.heal()
    c.tick("a", 2)
    assert not [m for m in c.delivered if m.type is MessageType.SNAP and m.to == "c"]


def test_config_change_compare_and_set_refuses_stale_expected_index() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.add_node("d")
    c.change("a", ConfigChangeType.ADD_LEARNER, "d")
    with pytest.raises(ConfigChangeRefused, match="stale config"):
        c.node("a").propose_config_change(
            ConfigChange(ConfigChangeType.PROMOTE, NodeId("d"), expected_index=0)
        )


def test_only_one_config_change_pending() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.add_node("d")
    c.add_node("e")
    c.isolate("b")
    c.isolate("c")  # the first change cannot commit
    a = c.node("a")
    a.propose_config_change(ConfigChange(ConfigChangeType.ADD_LEARNER, NodeId("d"), 0))
    with pytest.raises(ConfigChangeRefused, match="pending"):
        a.propose_config_change(ConfigChange(ConfigChangeType.ADD_LEARNER, NodeId("e"), 0))


def test_new_leader_refuses_config_change_before_its_noop_commits() -> None:
    c = Cluster(["a", "b", "c"])
    c.isolate("b")
    c.isolate("c")
    a = c.node("a").raft
    a.become_candidate()
    a.become_leader()  # leader by fiat, its no-op cannot commit while isolated
    with pytest.raises(ConfigChangeRefused):
        a.propose_config_change(ConfigChange(ConfigChangeType.REMOVE, NodeId("c"), 0))


def test_removing_the_leader_is_refused() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    with pytest.raises(ConfigChangeRefused, match="transfer leadership"):
        c.change("a", ConfigChangeType.REMOVE, "a")


def test_removed_node_becomes_non_participant_and_quorum_shrinks() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.change("a", ConfigChangeType.REMOVE, "c")
    c.tick("a", 2)
    assert c.node("a").raft.config.voters == {"a", "b"}
    c.isolate("c")
    c.propose("a", b"k=after")
    assert c.committed_data("b")[-1] == b"k=after"
    assert c.node("c").raft.role() in (Role.NON_PARTICIPANT, Role.FOLLOWER)


def test_config_takes_effect_when_appended_and_reverts_when_truncated() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.add_node("d")
    c.isolate("a")
    a = c.node("a").raft
    a.propose_config_change(ConfigChange(ConfigChangeType.ADD_LEARNER, NodeId("d"), 0))
    c.stabilize()
    assert "d" in a.config.learners  # in effect on append, before commit (thesis §4.1)
    c.tick_all(40)  # b or c becomes leader in a new term; a learns and truncates
    c.heal()
    c.tick_all(5)
    assert "d" not in c.node("a").raft.config.members
    assert c.node("a").raft.config.index == 0


# -- reads ------------------------------------------------------------------------------------


def test_read_index_released_after_quorum_heartbeat() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.propose("a", b"x=1")
    c.node("a").read_index(b"r1")
    c.stabilize()
    rs = c.nodes[NodeId("a")].read_states
    assert [(r.context, r.index) for r in rs] == [(b"r1", c.node("a").raft.log.committed)]


def test_read_index_not_released_by_isolated_leader() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.isolate("a")
    c.node("a").read_index(b"r1")
    c.stabilize()
    assert c.nodes[NodeId("a")].read_states == []


def test_read_index_waits_for_noop_of_current_term() -> None:
    c = Cluster(["a", "b", "c"])
    c.isolate("b")
    c.isolate("c")
    a = c.node("a").raft
    a.become_candidate()
    a.become_leader()
    c.node("a").read_index(b"r1")
    c.stabilize()
    assert c.nodes[NodeId("a")].read_states == []
    c.heal()
    c.tick("a", 1)
    c.stabilize()
    assert [r.context for r in c.nodes[NodeId("a")].read_states] == [b"r1"]


def test_read_index_on_follower_is_refused_with_leader_hint() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    with pytest.raises(ProposalDropped) as e:
        c.node("b").read_index(b"r")
    assert e.value.leader == "a"


def test_lease_read_served_without_heartbeat_round_only_while_lease_is_fresh() -> None:
    c = Cluster(["a", "b", "c"], lease_reads=True, election_tick=10)
    c.tick_all(35)  # with leases, fresh nodes wait an election timeout before voting
    lead = c.leader()
    assert lead is not None
    c.tick(lead, 1)  # a heartbeat round refreshes the lease
    c.delivered.clear()
    c.node(lead).read_index(b"lease")
    assert c.node(lead).raft.read_states  # served at once...
    assert not c.delivered  # ...without a heartbeat round
    c.isolate(lead)
    for _ in range(9):
        c.node(lead).tick()
    c.stabilize()
    c.node(lead).raft.read_states.clear()
    assert c.role(lead) is Role.LEADER
    c.node(lead).read_index(b"late")
    assert not c.node(lead).raft.read_states  # lease expired: no read without a quorum round


def test_lease_reads_restarted_node_waits_before_voting() -> None:
    c = Cluster(["a", "b", "c"], lease_reads=True, pre_vote=False)
    c.node("a").campaign()
    c.stabilize()
    assert c.role("a") is not Role.LEADER  # b and c just started: they may back someone's lease


# -- split votes: the jitter widens after each failed election --------------------------------


def _failover_in_slow_network(seed: int, backoff: bool) -> tuple[int, int]:
    """Kill leader a of three nodes timed as a master is (election 15 ticks, jitter 5), with
    every message taking 3 ticks to arrive (a vote round trip of 600 ms at 100 ms ticks: a
    loaded host). Returns (terms spent, ticks taken) until b or c leads."""
    c = Cluster(
        ["a", "b", "c"],
        seed=seed,
        election_tick=15,
        election_jitter_tick=5,
        election_backoff=backoff,
    )
    c.elect("a")
    c.down.add(NodeId("a"))
    live = [NodeId("b"), NodeId("c")]
    start = c.node("b").raft.term
    in_flight: list[tuple[int, Message]] = []
    for now in range(5000):
        for n in live:
            c.nodes[n].node.tick()
            c.process(n)
        in_flight += [(now + 3, m) for m in c.queue]
        c.queue.clear()
        due = [m for t, m in in_flight if t <= now]
        in_flight = [(t, m) for t, m in in_flight if t > now]
        for m in due:
            if m.to in live:
                c.nodes[m.to].node.step(m)
                c.process(m.to)
        for n in live:
            if c.role(n) is Role.LEADER:
                return c.node(n).raft.term - start, now
    raise AssertionError(f"seed {seed}: no leader after 5000 ticks")


def test_split_votes_widen_the_jitter_so_a_slow_network_still_elects_quickly() -> None:
    # Both survivors heard a's last heartbeat together, so their timers run in step: with five
    # possible draws and votes slower than a tick they keep starting within one round trip of
    # each other and splitting the vote. Widening the jitter after each failed election (up to
    # a whole election timeout) separates them within a few terms.
    plain = [_failover_in_slow_network(seed, backoff=False) for seed in range(40)]
    widened = [_failover_in_slow_network(seed, backoff=True) for seed in range(40)]
    plain_terms = sum(t for t, _ in plain)
    widened_terms = sum(t for t, _ in widened)
    assert widened_terms < 0.6 * plain_terms, (plain_terms, widened_terms)
    assert sum(k for _, k in widened) < 0.7 * sum(k for _, k in plain)
    assert max(t for t, _ in widened) <= 10


def test_the_jitter_widens_per_failed_election_and_narrows_once_a_leader_is_heard() -> None:
    c = Cluster(["a", "b", "c"], election_tick=10, election_jitter_tick=2)
    c.elect("a")
    b = c.node("b").raft
    assert 10 <= b.randomized_election_timeout < 12
    c.isolate("b")
    ceilings = []
    for _ in range(6):
        draws = set()
        for _ in range(40):  # every draw of this round (the rng moves on each time)
            b._draw_election_timeout()
            draws.add(b.randomized_election_timeout)
        ceilings.append(max(draws))
        b.become_candidate()  # an election that will not win: b is cut off
    # 2 ticks, then 4, 8, and never past a whole election timeout (10).
    assert ceilings == [11, 13, 17, 19, 19, 19]
    c.heal()
    c.tick_all(60)  # b's higher term forces an election; the group has a leader again
    assert c.leader() is not None and b.lead == c.leader()
    assert b.campaigns_without_leader == 0
    assert 10 <= b.randomized_election_timeout < 12


# -- leadership transfer (thesis §3.10) -------------------------------------------------------


def test_leadership_transfer_to_up_to_date_follower() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.propose("a", b"x=1")
    c.node("a").transfer_leader(NodeId("c"))
    c.stabilize()
    assert c.leader() == "c"
    assert c.role("a") is Role.FOLLOWER


def test_leadership_transfer_catches_up_lagging_target_first() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.isolate("c")
    for i in range(5):
        c.propose("a", b"x=%d" % i)
    c.heal()
    c.node("a").transfer_leader(NodeId("c"))
    c.stabilize()
    assert c.leader() == "c"
    assert c.committed_data("c")[:5] == [b"x=%d" % i for i in range(5)]


def test_proposals_dropped_during_transfer() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.isolate("c")
    c.node("a").transfer_leader(NodeId("c"))
    with pytest.raises(ProposalDropped, match="transfer"):
        c.node("a").propose(b"x=1")
    c.tick("a", 12)  # the transfer times out after an election timeout
    c.heal()
    c.node("a").propose(b"x=2")


# -- snapshots and log compaction -------------------------------------------------------------


def _c_behind_a_compacted_log(send_snapshots: bool = True) -> Cluster:
    """a leads; c missed 50 entries that a has since compacted away (healed, not yet ticked)."""
    c = Cluster(["a", "b", "c"], send_snapshots=send_snapshots)
    c.elect("a")
    c.isolate("c")
    for i in range(50):
        c.propose("a", b"k%d=%d" % (i, i))
    c.compact("a")
    assert c.node("a").raft.log.first_index() > 2
    c.heal()
    return c


def test_lagging_follower_catches_up_by_snapshot_after_compaction() -> None:
    c = _c_behind_a_compacted_log()
    c.tick("a", 3)
    snaps = [m for m in c.delivered if m.type is MessageType.SNAP and m.to == "c"]
    assert len(snaps) == 1
    assert c.nodes[NodeId("c")].kv == c.nodes[NodeId("a")].kv
    c.propose("a", b"after=1")
    assert c.nodes[NodeId("c")].kv[b"after"] == b"1"


def test_restart_recovers_from_snapshot_and_log() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    for i in range(20):
        c.propose("a", b"k%d=%d" % (i, i))
    c.compact("b", 10)
    c.restart("b")
    b = c.node("b").raft
    assert b.log.first_index() == 11 and b.log.last_index() == c.node("a").raft.log.last_index()
    c.tick_all(3)
    assert c.leader() == "a"


# -- replication pipeline and flow control ----------------------------------------------------


def test_replicate_state_pipelines_bounded_by_inflight_window() -> None:
    c = Cluster(["a", "b", "c"], max_inflight_msgs=4, max_size_per_msg=1)
    c.elect("a")
    c.isolate("b")  # b's responses never arrive: the window must stop the flood
    c.cut -= {(NodeId("a"), NodeId("b"))}
    c.cut.add((NodeId("b"), NodeId("a")))
    before = len([m for m in c.delivered if m.type is MessageType.APP and m.to == "b"])
    a = c.node("a")
    for i in range(20):
        a.propose(b"x=%d" % i)
    c.stabilize()
    sent = [m for m in c.delivered if m.type is MessageType.APP and m.to == "b"][before:]
    assert 0 < len(sent) <= 4
    assert c.committed_data("c")[-1] == b"x=19"  # c (with a) still commits everything


def test_a_snapshot_lost_on_the_way_is_sent_again_once_the_peer_is_reported_unreachable() -> None:
    """A peer waiting for a snapshot is sent nothing else. If the snapshot is lost (the
    transport failed to send it, and says so with report_unreachable), the leader must not
    wait for it for the rest of its term: it probes again and re-sends the snapshot."""
    c = _c_behind_a_compacted_log()
    lost = [True]

    def drop_first_snapshot(m: Message) -> bool:
        if m.type is MessageType.SNAP and m.to == "c" and lost[0]:
            lost[0] = False
            return True
        return False

    c.msg_filter.append(drop_first_snapshot)
    c.tick("a", 3)
    assert not lost[0] and c.nodes[NodeId("c")].kv != c.nodes[NodeId("a")].kv
    c.tick("a", 6)
    assert c.nodes[NodeId("c")].kv != c.nodes[NodeId("a")].kv  # still waiting: nothing sent
    c.node("a").report_unreachable(NodeId("c"))
    c.tick("a", 3)
    assert c.nodes[NodeId("c")].kv == c.nodes[NodeId("a")].kv
    c.propose("a", b"after=1")
    assert c.nodes[NodeId("c")].kv[b"after"] == b"1"


def test_a_snapshot_whose_acknowledgement_is_lost_is_settled_by_the_senders_report() -> None:
    """The snapshot lands but the follower's answer is lost: the leader waits in SNAPSHOT
    state, sending nothing but heartbeats, until the transport reports the snapshot sent
    (etcd's ReportSnapshot(finish)); then it probes from the snapshot's index."""
    from service.raft.progress import ProgressState

    c = _c_behind_a_compacted_log()
    lost = [True]

    def drop_first_answer_after_the_snapshot(m: Message) -> bool:
        applied = c.node("c").raft.log.committed >= c.node("a").raft.log.first_index() - 1
        if m.type is MessageType.APP_RESP and m.frm == "c" and lost[0] and applied:
            lost[0] = False
            return True
        return False

    c.msg_filter.append(drop_first_answer_after_the_snapshot)
    c.tick("a", 3)
    assert not lost[0]
    c.propose("a", b"after=1")
    c.tick("a", 6)
    pr = c.node("a").raft.prs[NodeId("c")]
    assert pr.state is ProgressState.SNAPSHOT and b"after" not in c.nodes[NodeId("c")].kv
    c.node("a").report_snapshot(NodeId("c"), ok=True)
    c.tick("a", 3)
    assert c.nodes[NodeId("c")].kv[b"after"] == b"1"


def test_without_snapshot_sending_a_lagging_follower_is_held_until_given_the_state() -> None:
    """RaftOptions.send_snapshots=False (a tablet, whose snapshots carry no rows): a follower
    that needs compacted entries is sent no snapshot, nor any append, only heartbeats, until
    the caller has copied the state over and reports it; then the log catches it up."""
    from service.raft.progress import ProgressState

    c = _c_behind_a_compacted_log(send_snapshots=False)
    c.tick("a", 6)
    to_c = [m for m in c.delivered if m.to == "c" and m.frm == "a"]
    assert not [m for m in to_c if m.type is MessageType.SNAP]
    assert c.node("a").status().progress[NodeId("c")].state is ProgressState.SNAPSHOT
    held = len([m for m in c.delivered if m.type is MessageType.APP and m.to == "c"])
    c.tick("a", 6)
    assert len([m for m in c.delivered if m.type is MessageType.APP and m.to == "c"]) == held
    assert c.nodes[NodeId("c")].kv != c.nodes[NodeId("a")].kv
    c.install_copy("c", "a")  # a tablet copy: the state at a's snapshot, then a restart
    c.node("a").report_snapshot(NodeId("c"), True)
    c.propose("a", b"after=1")
    c.tick("a", 3)
    assert c.nodes[NodeId("c")].kv == c.nodes[NodeId("a")].kv
    assert c.nodes[NodeId("c")].kv[b"after"] == b"1"
    assert not [m for m in c.delivered if m.type is MessageType.SNAP]
