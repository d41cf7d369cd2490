"""Full-report turns: which tablet servers the leader asks for their full report now.

Theory of operation
-------------------
A new leader wants a full tablet report from every server (docs/design/failover.md#R3), but
it reads large reports only a few at a time (`ReportGate.start_reading`): decoding one of
600 replicas takes milliseconds of Python, and sys.catalog's Raft ticks share the loop. When
every server was simply asked, every server sent its full report with every heartbeat until
one was read. At 200,000 tablets on 1,000 servers that was about 1,000 reports of 150 KB a
second for some 20 s, nearly all received, parsed and refused, and the leader's time went to
refusing them: a small table created meanwhile took up to 18 s to turn RUNNING.

So the leader hands out turns. A server whose full report is due is answered either
`needs_full_tablet_report` (its turn: send it now) or `full_tablet_report_deferred` (not yet:
send only what changes). At most `max_turns` servers hold a turn at once; a turn ends when the
server's full report has been processed (`done`), or lapses `lapse_s` after it was given, so a
server that stopped heartbeating does not keep its turn forever; a server whose turn lapsed
waits another `lapse_s` before it can have one again, so a server that heartbeats but never
sends its report (a fault, or a hostile peer) cannot keep a turn by asking at once. Turns
are first come, first served in heartbeat order, so every due server gets one within about
(due servers / reading rate) seconds.

Nothing here is needed for correctness: a deferred server still sends every change, and a
server that ignores the deferral (an older version) sends its full report anyway, which the
gate reads or refuses as before. Turns only decide who is asked.

Ownership: the master's event loop; no method blocks or awaits.
"""

from __future__ import annotations

from service.common.errors import InvalidArgument

__all__ = ["FullReportTurns"]


class FullReportTurns:
    """At most `max_turns` servers asked for a full report at once (module docstring).

    Invariant: `len(self._held) <= max_turns` after every call; `_held` maps a server's uuid to
    when its turn lapses, `_resting` a server whose turn lapsed to when it may have another
    (monotonic seconds, the caller's clock); no uuid is in both."""

    def __init__(self, max_turns: int, lapse_s: float) -> None:
        if max_turns < 1 or not lapse_s > 0:
            raise InvalidArgument(
                f"full report turns: max_turns must be >= 1 and lapse_s > 0, got {max_turns} "
                f"and {lapse_s}"
            )
        self.max_turns = max_turns
        self.lapse_s = lapse_s
        self._held: dict[str, float] = {}
        self._resting: dict[str, float] = {}
        self.given = 0
        """Turns handed out (a renewed turn is not counted again)."""
        self.lapsed = 0
        """Turns that ended without the server's full report processed."""

    def take(self, uuid: str, now: float) -> bool:
        """Whether `uuid`, whose full report is due, may send it now: it holds a turn that has
        not lapsed, or a turn is free and is given to it."""
        until = self._held.get(uuid)
        if until is not None:
            if now < until:
                return True
            self._lapse(uuid, now)
        rest = self._resting.get(uuid)
        if rest is not None:
            if now < rest:
                return False
            del self._resting[uuid]
        if len(self._held) >= self.max_turns:
            self._expire(now)
            if len(self._held) >= self.max_turns:
                return False
        self._held[uuid] = now + self.lapse_s
        self.given += 1
        return True

    def done(self, uuid: str) -> None:
        """`uuid`'s full report was processed (or is no longer wanted): its turn ends."""
        self._held.pop(uuid, None)
        self._resting.pop(uuid, None)

    def clear(self) -> None:
        """A new leadership: nobody holds a turn."""
        self._held.clear()
        self._resting.clear()

    def holding(self) -> int:
        return len(self._held)

    def _expire(self, now: float) -> None:
        for uuid in [u for u, until in self._held.items() if now >= until]:
            self._lapse(uuid, now)

    def _lapse(self, uuid: str, now: float) -> None:
        del self._held[uuid]
        self._resting[uuid] = now + self.lapse_s
        self.lapsed += 1
