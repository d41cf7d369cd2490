"""ProgressClock: the master's monotonic time, standing still while its own event loop stalls.

Theory of operation
-------------------
A tablet server is live while its last heartbeat is younger than the unresponsive timeout
(`ts_manager`). Measured on the wall's monotonic clock, that rule blames the server for the
master's own slowness: when the leader's event loop is busy for seconds (a huge synchronous
apply, a burst of RPC completions), heartbeats that arrived on time sit unread in the queue,
their servers' ages grow, and the master declares healthy servers dead. Dead servers then
make placement fail, which makes more work, which stalls the loop again: the "starvation
spiral" a 10,000-tablet CreateTable on 1,000 servers once set off. Kudu's rule is the one
kept here: liveness must never be a casualty of the catalog's background work.

Two fixes were considered:

* Re-check after catching up: before judging a server dead, wait until the loop has run
  smoothly for a heartbeat interval, so queued heartbeats are processed first. Every reader
  of liveness (placement, RPC skipping, eviction, listings) would need that wait, and a loop
  that is slow all the time would never get a verdict at all.
* Judge heartbeat ages on a clock of the master's own progress (chosen). A probe task wakes
  every `interval_s` and calls `tick()`. As long as consecutive ticks are less than
  `stall_threshold_s` apart, progress time runs exactly as monotonic time. A longer gap is a
  stall of the master: only its first `stall_threshold_s` count; the rest is discounted. So a
  server's age only grows while the master was able to listen for it, every reader of
  liveness stays a cheap synchronous call, and a really silent server is still declared dead
  (later by at most the time the master itself was stalled).

`monotonic()` also discounts the stall in progress: code running at the end of a long
synchronous stretch (the probe has not ticked for longer than the threshold) sees time
frozen at the start of the stall plus the threshold, so it cannot judge servers dead with
the stall counted either. Progress time is continuous and never decreases: a tick folds the
pending excess into `stalled_s`, which `monotonic()` was already subtracting.

Threshold: gaps below it are ordinary scheduling jitter and count fully; the default
(`MasterConfig.loop_stall_threshold_ms`, 500 ms) is half the tablet servers' heartbeat
interval, so a stall costs a server at most that much of its timeout however long it lasts.

The probe must run for the clock to advance beyond the threshold after the last tick, so
only the master wiring (which starts `run()`) uses this clock; tests and tools that never
start a probe give the TSManager a plain clock.
"""

from __future__ import annotations

from service.common.clock import Clock
from service.common.errors import InvalidArgument

__all__ = ["ProgressClock"]


class ProgressClock:
    """A `Clock` whose `monotonic()` excludes the master's own loop stalls (module docstring).

    Invariants: `_last` is the base clock's monotonic time of the last tick;
    `stalled_s` >= 0 never decreases; `monotonic()` never decreases.
    """

    def __init__(self, base: Clock, stall_threshold_s: float, interval_s: float | None = None):
        if not stall_threshold_s > 0:
            raise InvalidArgument(f"stall_threshold_s: must be > 0, got {stall_threshold_s}")
        interval = stall_threshold_s / 5 if interval_s is None else interval_s
        if not 0 < interval < stall_threshold_s:
            raise InvalidArgument(
                f"interval_s: must be > 0 and below stall_threshold_s ({stall_threshold_s}), "
                f"got {interval}"
            )
        self._base = base
        self.stall_threshold_s = float(stall_threshold_s)
        self.interval_s = float(interval)
        self._last = base.monotonic()
        self.stalled_s = 0.0
        """Seconds discounted so far (stalls beyond the threshold), for /metrics."""
        self.stalls = 0
        """Gaps longer than the threshold seen so far."""

    def tick(self) -> None:
        """The loop made progress now (the probe calls this every `interval_s`)."""
        now = self._base.monotonic()
        excess = now - self._last - self.stall_threshold_s
        if excess > 0:
            self.stalled_s += excess
            self.stalls += 1
        self._last = max(self._last, now)

    def monotonic(self) -> float:
        now = self._base.monotonic()
        pending = max(0.0, now - self._last - self.stall_threshold_s)
        return now - self.stalled_s - pending

    def now(self) -> float:
        """Wall-clock time, unchanged (never used to measure durations)."""
        return self._base.now()

    async def sleep(self, seconds: float) -> None:
        """Sleeps on the base clock."""
        await self._base.sleep(seconds)

    async def run(self) -> None:
        """The probe: tick every `interval_s` until cancelled."""
        while True:
            self.tick()
            await self._base.sleep(self.interval_s)
