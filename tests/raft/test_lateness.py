"""Election timeouts stretch while a live leader's messages arrive late (service/raft/lateness.py).

A starved leader is modelled on the synchronous harness by ticking it once for every k ticks
of its followers: its heartbeats, due every 2 of its ticks, reach them 2k of theirs apart. The
same schedule with stretching off must start elections (else the test shows nothing)."""

from __future__ import annotations

import pytest

from service.raft import MessageType, NodeId, Role
from service.raft.lateness import DEFAULT_HALF_LIFE_TICK, Lateness
from service.testing.raft_harness import Cluster

HEARTBEAT, ELECTION, MAX = 2, 6, 60
RAMP = [2] * 20 + [3] * 20 + [4] * 20 + [6] * 20
"""Follower ticks per leader tick, round by round: the leader gets slower and slower."""


def starved_leader(max_election_tick: int, seed: int) -> Cluster:
    c = Cluster(
        ["a", "b", "c"],
        seed=seed,
        election_tick=ELECTION,
        heartbeat_tick=HEARTBEAT,
        max_election_tick=max_election_tick,
    )
    c.elect("a")
    for k in RAMP:
        c.tick("a")
        for _ in range(k):
            c.tick("b")
            c.tick("c")
    return c


@pytest.mark.parametrize("seed", range(5))
def test_a_slower_and_slower_leader_keeps_its_followers(seed: int) -> None:
    c = starved_leader(MAX, seed)
    assert c.role("a") is Role.LEADER
    assert {c.node(n).raft.term for n in "abc"} == {1}, "an election while the leader lived"
    # Heartbeats 12 follower ticks apart: a lost one no longer starts an election.
    assert c.node("b").raft.election_timeout() > 2 * 12
    # ...and the shell sees the stretch through the node's status (its metrics export it).
    assert c.node("b").status().election_timeout == c.node("b").raft.election_timeout()


@pytest.mark.parametrize("seed", range(5))
def test_without_stretching_the_same_schedule_starts_elections(seed: int) -> None:
    c = starved_leader(0, seed)
    assert max(c.node(n).raft.term for n in "abc") > 1


def test_on_time_again_the_timeout_returns_and_a_dead_leader_is_replaced() -> None:
    c = starved_leader(MAX, seed=1)
    c.tick_all(5 * DEFAULT_HALF_LIFE_TICK)  # the estimate back from the cap to a heartbeat
    assert c.node("b").raft.election_timeout() == ELECTION
    assert c.node("c").raft.election_timeout() == ELECTION
    assert c.node("b").status().election_timeout == ELECTION
    c.down.add(NodeId("a"))
    for _ in range(2 * ELECTION + 2):  # the timeout with its whole jitter, and the votes
        c.tick("b")
        c.tick("c")
    assert c.leader() in ("b", "c")


def _leader_held_now_and_then(half_life_tick: int, seed: int) -> tuple[Cluster, int]:
    """A master group at its default timing (100 ms ticks: heartbeats every 5, timeouts 15-20,
    the cap 60) whose leader, on a shared host, stops running for 0.6 s every 4 s, then once
    for 1.5 s, runs on time for 45 s, and stops for 3.1 s: the pattern that deposed a scale
    run's leader five times in 20 minutes. While it is held its followers' clocks run and its
    own does not. Returns the cluster and the followers' term before the last hold."""
    c = Cluster(
        ["a", "b", "c"],
        seed=seed,
        heartbeat_tick=5,
        election_tick=15,
        election_jitter_tick=5,
        max_election_tick=60,
        lateness_half_life_tick=half_life_tick,
    )
    c.elect("a")
    c.tick_all(100)
    term = 0
    for hold, then in [(6, 34)] * 10 + [(15, 450), (31, 50)]:
        term = max(c.node(n).raft.term for n in "abc")
        for _ in range(hold):
            c.tick("b")
            c.tick("c")
        c.tick_all(then)
    return c, term


@pytest.mark.parametrize("seed", range(5))
def test_a_leader_held_now_and_then_is_remembered_as_late_between_holds(seed: int) -> None:
    c, _ = _leader_held_now_and_then(DEFAULT_HALF_LIFE_TICK, seed)
    assert c.role("a") is Role.LEADER
    assert {c.node(n).raft.term for n in "abc"} == {1}, "an election while the leader lived"
    # Forgotten within seconds (a half-life of 14 s), the 1.5 s hold, itself survived, no
    # longer stretches the followers' timeouts when the 3.1 s one comes 45 s later, and they
    # elect a leader as starved as "a".
    forgetful, before_last = _leader_held_now_and_then(140, seed)
    assert before_last == 1
    assert max(forgetful.node(n).raft.term for n in "abc") > 1


def test_an_absence_longer_than_the_cap_is_not_lateness() -> None:
    c = Cluster(
        ["a", "b", "c"], election_tick=ELECTION, heartbeat_tick=HEARTBEAT, max_election_tick=MAX
    )
    c.elect("a")
    c.tick_all(10)
    c.isolate("c")
    for _ in range(MAX + 10):  # c hears nothing, campaigns in vain (pre-votes refused)
        c.tick_all()
    c.heal()
    c.tick_all(10)
    assert c.leader() == "a"
    assert c.node("c").raft.election_timeout() == ELECTION


def test_the_estimate_rises_at_once_decays_slowly_and_ignores_phase() -> None:
    late = Lateness(heartbeat_tick=5, election_tick=15, max_election_tick=60)
    for now in (0, 5, 11, 16):  # a tick of phase between two clocks is on time
        late.heard(NodeId("l"), now)
    assert late.stretch() == 0
    late.heard(NodeId("l"), 26)  # 10 ticks: 4 late, 3 heartbeats' worth each
    assert late.stretch() == 12
    late.tick()
    assert 0 < late.stretch() <= 12
    late.heard(NodeId("l"), 200)  # longer than the cap: an absence
    assert late.stretch() <= 12
    late.heard(NodeId("l"), 250)
    assert late.stretch() == 60 - 15  # capped
    late.forget()
    late.heard(NodeId("l"), 900)  # no gap spans a role or term change
    assert late.stretch() == 45
    off = Lateness(heartbeat_tick=5, election_tick=15, max_election_tick=15)
    off.heard(NodeId("l"), 0)
    off.heard(NodeId("l"), 14)
    assert not off.enabled and off.stretch() == 0


def test_a_late_tick_brings_the_leaders_next_heartbeat_forward_and_nothing_else() -> None:
    """The caller's timer fired 4 intervals late: a leader heartbeats on that tick (its
    heartbeats keep to real time), but its check-quorum and its followers' election timers
    count only ticks (a stall is not silence)."""
    c = Cluster(["a", "b", "c"], election_tick=10, heartbeat_tick=5)
    c.elect("a")
    leader = c.node("a").raft
    c.delivered.clear()
    c.node("a").tick()  # heartbeat_elapsed 1 of 5: nothing due
    c.stabilize()
    assert not [m for m in c.delivered if m.type is MessageType.HEARTBEAT]
    elapsed = leader.election_elapsed
    c.node("a").tick(late_ticks=4)
    c.stabilize()
    beats = [m.to for m in c.delivered if m.type is MessageType.HEARTBEAT]
    assert sorted(beats) == ["b", "c"]
    assert leader.election_elapsed == elapsed + 1
    # A follower's late tick changes nothing: it counts one tick.
    b = c.node("b").raft
    before = b.election_elapsed
    c.node("b").tick(late_ticks=50)
    assert b.election_elapsed == before + 1 and b.state is Role.FOLLOWER


CAP = 18
"""A cap that a hold of 10 ticks reaches (the tests below)."""


def _silent_ticks_until_step_down(c: Cluster, limit: int) -> int:
    """Tick the leader "a" alone until it steps down; the ticks it took, or `limit`."""
    for n in range(1, limit + 1):
        c.tick("a")
        if c.role("a") is not Role.LEADER:
            return n
    return limit


def _leader_whose_followers_went_silent() -> Cluster:
    """A leader whose followers stopped answering (applying a large entry, say) at the start
    of its check-quorum period, one tick before the check that would depose it."""
    c = Cluster(
        ["a", "b", "c"], election_tick=ELECTION, heartbeat_tick=HEARTBEAT, max_election_tick=CAP
    )
    c.elect("a")
    leader = c.node("a").raft
    c.partition(["a"], ["b", "c"])
    c.tick("a")
    while leader.election_elapsed != 0:  # a check that still counts their last answers
        c.tick("a")
    c.tick("a", leader.check_quorum_period() - 1)
    assert c.role("a") is Role.LEADER
    return c


def test_a_leader_gives_its_followers_a_whole_stretched_period_after_a_long_apply() -> None:
    """The leader then applied, for 10 ticks, an entry its followers apply too: they are as
    silent as it was. From the end of its apply it waits a whole check-quorum period,
    stretched to the cap, before it judges them; without the note it steps down at once."""
    c = _leader_whose_followers_went_silent()
    c.node("a").held_applying(10)
    assert c.node("a").raft.election_timeout() == CAP
    assert c.node("a").status().election_timeout == CAP
    took = _silent_ticks_until_step_down(c, 4 * CAP)
    assert CAP <= took <= CAP + 1, took

    control = _leader_whose_followers_went_silent()
    assert _silent_ticks_until_step_down(control, 4 * CAP) == 1


def test_a_follower_held_applying_stretches_its_own_timeout_too() -> None:
    """Its leader applies the same entry: it may stay silent as long, and the follower waits
    for it the stretched timeout. A leader that really died is still replaced within it."""
    c = Cluster(
        ["a", "b", "c"], election_tick=ELECTION, heartbeat_tick=HEARTBEAT, max_election_tick=CAP
    )
    c.elect("a")
    c.tick_all(3)
    c.node("b").held_applying(10)
    c.node("c").held_applying(10)
    assert c.node("b").raft.election_timeout() == CAP
    c.down.add(NodeId("a"))
    for _ in range(CAP - 2):  # not before the stretched timeout (a tick of it has passed)...
        c.tick("b")
        c.tick("c")
    assert c.node("b").raft.term == 1 and c.node("c").raft.term == 1
    for _ in range(2 * CAP + ELECTION + 2):  # ...but within it, its decay and the jitter
        c.tick("b")
        c.tick("c")
    assert c.leader() in ("b", "c")


def test_the_estimate_halves_in_a_half_life_and_never_falls_below_a_heartbeat() -> None:
    late = Lateness(heartbeat_tick=5, election_tick=15, max_election_tick=60, half_life_tick=100)
    late.held(35)  # a gap of 40 ticks
    assert late.estimate == 40
    for _ in range(100):
        late.tick()
    assert late.estimate == pytest.approx(20)
    for _ in range(1000):
        late.tick()
    assert late.estimate == 5 and late.stretch() == 0
    with pytest.raises(ValueError, match="half_life_tick"):
        Lateness(heartbeat_tick=5, election_tick=15, max_election_tick=60, half_life_tick=0)


def test_held_counts_as_a_gap_capped_and_nothing_when_off() -> None:
    late = Lateness(heartbeat_tick=5, election_tick=15, max_election_tick=60)
    late.held(0)
    assert late.stretch() == 0
    late.held(5)  # answers 10 ticks apart: as a heard gap of 10
    assert late.stretch() == 12
    late.held(500)  # longer than the cap: the peers are busy, not gone; capped
    assert late.stretch() == 60 - 15
    off = Lateness(heartbeat_tick=5, election_tick=15, max_election_tick=15)
    off.held(10)
    assert not off.enabled and off.stretch() == 0


def test_a_leader_that_loses_its_quorum_says_how_long_each_follower_was_silent() -> None:
    c = Cluster(["a", "b", "c"], election_tick=ELECTION, heartbeat_tick=HEARTBEAT)
    c.elect("a")
    c.tick_all(3)
    assert c.node("a").take_quorum_lost() is None
    c.isolate("c")
    c.tick_all(ELECTION)
    c.isolate("b")
    took = _silent_ticks_until_step_down(c, 4 * ELECTION)
    lost = c.node("a").take_quorum_lost()
    assert lost is not None and lost.term == 1 and lost.period == ELECTION
    ago = dict(lost.silent)
    assert set(ago) == {"b", "c"}
    b, cc = ago[NodeId("b")], ago[NodeId("c")]
    assert b is not None and cc is not None
    assert took <= b < cc  # b went silent later than c, and not before the last check
    assert c.node("a").take_quorum_lost() is None  # taken once


def test_a_leader_waits_for_its_followers_as_long_as_they_may_wait_for_it() -> None:
    """With timeouts that stretch up to CAP, a follower may wait that long for its leader, and
    a leader waits as long for a quorum's answers before it steps down (`check_quorum_period`):
    giving up sooner, it would start the election its followers would not. Without
    stretching, an election timeout."""
    stretching = Cluster(
        ["a", "b", "c"], election_tick=ELECTION, heartbeat_tick=HEARTBEAT, max_election_tick=CAP
    )
    fixed = Cluster(["a", "b", "c"], election_tick=ELECTION, heartbeat_tick=HEARTBEAT)
    took = {}
    for name, c in (("stretching", stretching), ("fixed", fixed)):
        c.elect("a")
        c.tick_all(3)
        c.partition(["a"], ["b", "c"])
        took[name] = _silent_ticks_until_step_down(c, 4 * CAP)
    assert CAP <= took["stretching"] <= 2 * CAP, took
    assert took["fixed"] <= 2 * ELECTION, took
    assert stretching.node("a").raft.check_quorum_period() == CAP


def test_a_follower_told_its_leader_is_gone_waits_the_configured_timeout_not_the_stretch() -> None:
    """A leader whose server closed its connections (an exited process) is absent, not late:
    its followers drop their stretch and elect a new leader within the configured timeout and
    its jitter. Told of another node, or as the leader, nothing changes; left untold, the
    stretched followers are still waiting then."""
    for told in (True, False):
        c = starved_leader(MAX, seed=1)
        stretched = c.node("b").raft.election_timeout()
        leaders = c.node("a").raft.election_timeout()
        assert stretched > 2 * ELECTION + 2
        c.node("b").leader_gone(NodeId("c"))  # not b's leader
        c.node("a").leader_gone(NodeId("a"))  # a leads: nothing to wait for
        assert c.node("b").raft.election_timeout() == stretched
        assert c.node("a").raft.election_timeout() == leaders
        c.down.add(NodeId("a"))
        if told:
            c.node("b").leader_gone(NodeId("a"))
            c.node("c").leader_gone(NodeId("a"))
            assert c.node("b").raft.election_timeout() == ELECTION
            assert c.node("c").raft.election_timeout() == ELECTION
        for _ in range(2 * ELECTION + 2):  # the configured timeout, its jitter, the votes
            c.tick("b")
            c.tick("c")
        if told:
            assert c.leader() in ("b", "c")
        else:
            assert {c.node(n).raft.term for n in "bc"} == {1}
