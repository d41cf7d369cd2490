"""CreateTablet calls paced by what each tablet server absorbs, and which slow tablets to replace.

Theory of operation
-------------------
On a busy or slow host the master must not turn slowness into more work
(docs/design/catalog.md#R16). Two pure pieces, both soft state of one leader:

`CreatePacer`: a window of CreateTablet calls in flight per tablet server, adapted to how the
server answers (additive increase, multiplicative decrease, as TCP's congestion window):
  * an answer within `latency_target_s` opens the window by 1/window (one call per window's
    worth of good answers), up to `max_window`;
  * a refusal with RESOURCE_EXHAUSTED (the server's creation gate is full), or a call that
    timed out or answered slower than `latency_target_s`, halves it, down to 1 (at most once
    per smoothed latency, so a burst of refusals from one full queue counts once);
  * each call's deadline is `deadline_factor` times the server's smoothed latency, within
    [`min_deadline_s`, `max_deadline_s`]: a server that is slow but working gets the time it
    needs instead of a deadline it keeps missing.
The background tasks start a CreateTablet task only when every server it still has to call has
room in its window (`background_tasks`); the others wait in their queue.

`ReplacementRules`: when a CREATING tablet has waited too long. The timer runs from the last
sign of progress, not from the first call: a replica that answered CreateTablet, a server that
refused with RESOURCE_EXHAUSTED (alive, busy), or a replica that reported the tablet each start
it again. And:
  * a tablet a majority of whose replicas answered is replaced only after `answered_factor`
    timeouts without progress (its replicas exist; they are electing, or catching up);
  * a partition replaced before waits longer each time: timeout x 2^k for its k-th replacement,
    up to `max_backoff_factor`;
  * at most `max_in_flight` replacements (tablets that replace another and are not yet
    RUNNING) exist at once, cluster-wide, and at most `max_in_flight_per_ts` were made for
    the tablets of one server; a timed-out tablet beyond them waits (`postpone_s`), because a
    replacement is new work for servers that are likely the same busy ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from service.common.ids import NodeId, TabletId
from service.master.catalog_info import CatalogMaps, TabletInfo
from service.master.catalog_records import TabletState

__all__ = ["CreatePacer", "Outcome", "ReplacementRules", "ServerWindow"]


class Outcome:
    """How one CreateTablet call ended, as the pacer sees it."""

    OK = "ok"
    SHED = "shed"
    """RESOURCE_EXHAUSTED: the server is alive and busy; try later."""
    TIMEOUT = "timeout"
    FAILED = "failed"
    """Any other error (the server said no for a reason of its own, or is unreachable)."""


@dataclass
class ServerWindow:
    """One tablet server's window (`CreatePacer`)."""

    window: float
    in_flight: int = 0
    latency_s: float | None = None
    """Smoothed latency of answered calls (EWMA, weight 1/8 per answer)."""
    last_cut: float = float("-inf")
    ok: int = 0
    shed: int = 0
    timeouts: int = 0
    failed: int = 0

    @property
    def room(self) -> int:
        return max(0, int(self.window) - self.in_flight)


@dataclass
class CreatePacer:
    """Per-server windows of CreateTablet calls in flight (module docstring)."""

    initial_window: int = 8
    max_window: int = 64
    min_deadline_s: float = 10.0
    max_deadline_s: float = 120.0
    deadline_factor: float = 4.0
    latency_target_s: float = 2.0
    servers: dict[NodeId, ServerWindow] = field(default_factory=dict)

    def _w(self, server: NodeId) -> ServerWindow:
        w = self.servers.get(server)
        if w is None:
            w = self.servers[server] = ServerWindow(float(self.initial_window))
        return w

    def has_room(self, servers: Iterable[NodeId]) -> bool:
        return all(self._w(s).room > 0 for s in servers)

    def start(self, server: NodeId) -> float:
        """A call to `server` goes out now: count it in flight; returns its deadline."""
        w = self._w(server)
        w.in_flight += 1
        return self.deadline_s(server)

    def release(self, server: NodeId) -> None:
        """A call counted by `start` was never made: give its slot back, learning nothing."""
        w = self._w(server)
        w.in_flight = max(0, w.in_flight - 1)

    def deadline_s(self, server: NodeId) -> float:
        w = self._w(server)
        if w.latency_s is None:
            return self.min_deadline_s
        want = self.deadline_factor * w.latency_s
        return min(self.max_deadline_s, max(self.min_deadline_s, want))

    def finish(self, server: NodeId, outcome: str, latency_s: float, now: float) -> None:
        """The call to `server` started by `start` ended with `outcome` after `latency_s`."""
        w = self._w(server)
        w.in_flight = max(0, w.in_flight - 1)
        if outcome == Outcome.OK:
            w.ok += 1
            w.latency_s = latency_s if w.latency_s is None else w.latency_s * 0.875 + latency_s / 8
            if latency_s <= self.latency_target_s:
                w.window = min(float(self.max_window), w.window + 1.0 / w.window)
            else:
                self._cut(w, now)
        elif outcome == Outcome.SHED:
            w.shed += 1
            self._cut(w, now)
        elif outcome == Outcome.TIMEOUT:
            w.timeouts += 1
            # What the call cost at least: a timed-out call's latency is its deadline.
            w.latency_s = latency_s if w.latency_s is None else max(w.latency_s, latency_s / 2)
            self._cut(w, now)
        else:
            w.failed += 1

    def _cut(self, w: ServerWindow, now: float) -> None:
        if now - w.last_cut < max(w.latency_s or 0.0, 0.1):
            return  # one cut per round trip: a burst of refusals is one signal
        w.last_cut = now
        w.window = max(1.0, w.window / 2)

    def views(self) -> list[tuple[NodeId, ServerWindow]]:
        return sorted(self.servers.items())


@dataclass(frozen=True)
class ReplacementRules:
    """When a CREATING tablet is replaced (module docstring). Times are seconds."""

    timeout_s: float
    answered_factor: float = 10.0
    max_backoff_factor: float = 8.0
    max_in_flight: int = 100
    max_in_flight_per_ts: int = 20

    @property
    def postpone_s(self) -> float:
        """How long a timed-out tablet refused a replacement by the budgets waits to be
        looked at again."""
        return max(0.05, self.timeout_s / 4)

    def timeout_for(self, maps: CatalogMaps, tablet_id: TabletId, answered: int) -> float:
        """How long tablet `tablet_id` may go without progress; `answered`: its replicas
        that answered CreateTablet or reported it."""
        info = maps.tablets_by_id.get(tablet_id)
        t = self.timeout_s
        if info is None:
            return t
        t *= min(self.max_backoff_factor, 2.0 ** generation(maps, info))
        cs = info.record.consensus
        voters = len(cs.peers) if cs is not None else 0
        if voters and answered >= voters // 2 + 1:
            t *= self.answered_factor
        return t

    def admit(
        self, maps: CatalogMaps, expired: Sequence[TabletInfo]
    ) -> tuple[list[TabletInfo], list[TabletInfo]]:
        """Split timed-out tablets into those replaced now and those that wait (budgets)."""
        if not expired:
            return [], []
        total, per_ts = replacements_in_flight(maps)
        now: list[TabletInfo] = []
        wait: list[TabletInfo] = []
        for info in expired:
            servers = _servers(info)
            if total >= self.max_in_flight or any(
                per_ts.get(s, 0) >= self.max_in_flight_per_ts for s in servers
            ):
                wait.append(info)
                continue
            total += 1
            for s in servers:
                per_ts[s] = per_ts.get(s, 0) + 1
            now.append(info)
        return now, wait


def generation(maps: CatalogMaps, info: TabletInfo, limit: int = 8) -> int:
    """How many tablets this one's partition had before it (the `replaces` chain, up to
    `limit`)."""
    n = 0
    record = info.record
    while record.replaces and n < limit:
        n += 1
        prev = maps.tablets_by_id.get(TabletId(record.replaces))
        if prev is None:
            break
        record = prev.record
    return n


def replacements_in_flight(maps: CatalogMaps) -> tuple[int, dict[NodeId, int]]:
    """Replacement tablets not yet RUNNING: how many, and per server of the tablet each
    replaced (the servers whose slowness made it)."""
    total = 0
    per_ts: dict[NodeId, int] = {}
    for tablet_id in maps.pending:
        info = maps.tablets_by_id.get(tablet_id)
        if info is None or not info.record.replaces:
            continue
        if info.state not in (TabletState.PREPARING, TabletState.CREATING):
            continue
        total += 1
        old = maps.tablets_by_id.get(TabletId(info.record.replaces))
        if old is not None:
            for s in _servers(old):
                per_ts[s] = per_ts.get(s, 0) + 1
    return total, per_ts


def _servers(info: TabletInfo) -> tuple[NodeId, ...]:
    cs = info.record.consensus
    return tuple(p.uuid for p in cs.peers) if cs is not None else ()


def answered_count(answered: Mapping[TabletId, set[NodeId]], tablet_id: TabletId) -> int:
    return len(answered.get(tablet_id, ()))
