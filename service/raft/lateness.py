"""Election timeouts that stretch while a live group's messages arrive late.

Why
---
A follower campaigns when it has heard nothing from its leader for an election timeout, counted
in its own ticks; a leader (check-quorum) steps down when it has heard nothing from a quorum for
one. Both assume that a live peer's messages arrive within about a heartbeat interval. On a host
short of CPU that stops being true without anyone failing: measured on a 2-core machine with
three masters, two fleet simulators and a busy loop, a master's event loop went 0.5-0.8 s at a
time without running, so the leader's heartbeats, due every 5 ticks, reached its followers 15-20
of their ticks apart. Each such gap started a pre-vote; when both followers saw one at once the
group elected a new leader, which was as starved as the old one, and a leader elected that way
then stepped down 1.6 s later for want of answers. Every election costs the whole catalog a
leader change in the middle of the load that caused it.

What
----
Each node measures, in its own ticks, the gap between consecutive messages from each peer it hears
as part of a live group: a follower from its leader (appends, heartbeats, snapshots), a leader from
each follower (their answers). `estimate` is the largest recent gap: a new gap raises it at once,
and it decays with a half-life of `half_life_tick` ticks (`[raft] lateness_half_life_ms`, 3 minutes
by default), so a host that recovers gets its normal timeouts back within about ten minutes. The
lateness is the estimate beyond one heartbeat interval plus `SLACK_TICKS` (a tick of phase between
two nodes' clocks is not lateness); each tick of it adds `missed` ticks to the timeout, where
`missed` = election timeout / heartbeat interval is how many heartbeats the configured timeout
tolerates (3 by default), so the timeout keeps tolerating that many of the heartbeats as they
arrive now. The result is capped at `max_election_tick`. A gap longer than the cap is an absence (a
partition, a restart), not lateness, and is not counted. The table of last contacts is cleared
whenever the node's role or term changes, so a gap never spans an election.

An absence is sometimes known at once: a process that exits (a crash, `kill -9`) has its
sockets closed by the kernel, and its peers' connections to it fail UNAVAILABLE within
milliseconds, while a starved process keeps its connections open and is only late. A follower
told that its leader's connection failed so (`gone`, through `RawNode.leader_gone`) drops its
stretch and waits the configured timeout (in one scale run beside a busy loop, new masters
were elected 3.5-3.6 s after two leaders were killed, against 1.6 s after a third). It still
waits that whole timeout, never less, so the leases below keep their footing even when the
leader turns out to be alive (its connections to the follower are its own, and its
heartbeats, if it sends any, keep the group as it is).

Lateness is also predicted, not only heard: a node that was just held applying committed entries
large enough that its peers apply them at the same time (`held`, called through
`Raft.held_applying`) counts the time it was held as a gap, because its peers, held as long,
will answer about that late. Without it the estimate rises only when a late message finally
arrives, after the timeout it should have stretched. For the same reason a leader does not
rely on its own estimate for check-quorum: with stretching on, it waits the cap
(`Raft.check_quorum_period`), as long as its followers may wait for it.

Why the memory is minutes long
------------------------------
A starved host does not hold every message late; it holds some, at intervals. Beside a busy
loop, a scale run's leader went 1-2 s without running every 10-60 s, and now and then 2-3 s.
With a half-life of 14 s, the one used at first, the stretch from a 2 s hold was gone 45 s
later, and the next 3 s hold found the followers at their configured timeouts: five elections
in 20 minutes, each new leader as starved as the last. Lateness on a shared host comes and
goes over minutes (a neighbour's batch job, a burst of creates), so the estimate remembers it
that long. The price is paid only if a leader hangs without its process exiting in those
minutes: its followers wait up to `max_election_tick` for it.

What it does not change
-----------------------
Safety never depends on timing in Raft, so stretching is safe. Leases (`reads.py`) are counted
from the configured election timeout, never the stretched one, so they are only safer: a
follower refuses votes at least as long as the lease assumes. On a quiet host the estimate is
the heartbeat interval and nothing stretches. The price is a slower failover while the host has
recently been slow: up to `max_election_tick` instead of the election timeout.
"""

from __future__ import annotations

from service.raft.types import NodeId

__all__ = ["DEFAULT_HALF_LIFE_TICK", "SLACK_TICKS", "Lateness"]

DEFAULT_HALF_LIFE_TICK = 1800
"""Ticks for the estimate to halve (it never falls below a heartbeat interval): 3 minutes at
the default 100 ms tick (module docstring: why minutes)."""

SLACK_TICKS = 1
"""Gaps up to a heartbeat interval plus this many ticks are on time."""


class Lateness:
    """One node's measure of how late its peers' messages arrive, in ticks (module docstring)."""

    def __init__(
        self,
        heartbeat_tick: int,
        election_tick: int,
        max_election_tick: int,
        half_life_tick: int = DEFAULT_HALF_LIFE_TICK,
    ) -> None:
        if half_life_tick <= 0:
            raise ValueError(f"half_life_tick must be positive, not {half_life_tick}")
        self.heartbeat_tick = heartbeat_tick
        self.election_tick = election_tick
        self.max_election_tick = max(max_election_tick, election_tick)
        self.decay = 0.5 ** (1 / half_life_tick)
        """The factor the estimate shrinks by every tick."""
        self.missed = election_tick / heartbeat_tick
        """Heartbeat intervals the configured election timeout tolerates."""
        self.estimate = float(heartbeat_tick)
        """The largest recent gap between two messages of one peer, decayed (ticks)."""
        self._last: dict[NodeId, int] = {}

    @property
    def enabled(self) -> bool:
        return self.max_election_tick > self.election_tick

    def heard(self, peer: NodeId, now: int) -> None:
        """A message from `peer` at tick `now` (the node's tick count). Recorded even with
        stretching off: a leader that steps down at a quorum check reports when it last heard
        each follower (`last_heard`)."""
        last = self._last.get(peer)
        self._last[peer] = now
        if last is None or not self.enabled:
            return
        gap = now - last
        if gap <= self.max_election_tick:
            self.estimate = max(self.estimate, float(gap))

    def held(self, ticks: int) -> None:
        """This node was held `ticks` ticks doing work its peers do too (applying the same
        large entries, `Raft.held_applying`): their messages may now come that much later than
        a heartbeat interval, as a gap of that length heard from a peer would say. Capped, not
        ignored, past `max_election_tick`: the peers are known to be alive."""
        if not self.enabled or ticks <= 0:
            return
        gap = min(ticks + self.heartbeat_tick, self.max_election_tick)
        self.estimate = max(self.estimate, float(gap))

    def last_heard(self, peer: NodeId) -> int | None:
        """The tick of `peer`'s last message as part of a live group since this node's role or
        term last changed (None: none since)."""
        return self._last.get(peer)

    def tick(self) -> None:
        if self.estimate > self.heartbeat_tick:
            self.estimate = max(float(self.heartbeat_tick), self.estimate * self.decay)

    def gone(self) -> None:
        """The peer this node waits for (its leader) is gone, not late: its server closed the
        connection (`Raft.leader_gone`). The timeout goes back to the configured one: an
        exited process is an absence, and stretching for it only delays the failover."""
        self.estimate = float(self.heartbeat_tick)

    def forget(self) -> None:
        """The node's role or term changed: no gap spans it."""
        self._last.clear()

    def stretch(self) -> int:
        """Ticks to add to the election timeout now (0 on a quiet host)."""
        late = self.estimate - self.heartbeat_tick - SLACK_TICKS
        if late <= 0:
            return 0
        return min(self.max_election_tick - self.election_tick, round(late * self.missed))
