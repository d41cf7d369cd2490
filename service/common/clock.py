"""Time as an injected dependency: a `Clock` protocol, the real clock and a manual one.

Every component of the asyncio shell that waits or measures (Raft tick loops, heartbeaters,
leases, retry back-off, tablet server liveness) takes a `Clock` instead of calling `time` and
`asyncio.sleep`, so tests run on a `ManualClock` and are deterministic and instant (the pure
Raft core does not even see a clock: it gets `tick()` calls).

Two readings, never mixed:

* `monotonic()` measures intervals, deadlines and leases. It never goes backwards and is
  unrelated to the calendar.
* `now()` is wall-clock time for humans and for data (timestamps in records, token expiry that
  other machines check). It may jump; never use it to measure a duration.

ManualClock semantics
---------------------
Time moves only when the test says so. A sleeper's deadline is `monotonic() + seconds` at the
time it calls `sleep`. `advance(seconds)` moves time forward and wakes every sleeper whose
deadline is now reached (deadline <= monotonic()), in deadline order, ties in the order the
sleeps began; asyncio resumes them in that order. `advance` is synchronous: the woken tasks run
at the caller's next await, and all of them see the final time. To let periodic loops fire once
per period inside a long advance, use `await advance_through(seconds)`: it stops at each
deadline in turn, sets the time to it, wakes its sleepers and yields to the event loop so they
can run and sleep again before time moves on.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "RealClock"]


@runtime_checkable
class Clock(Protocol):
    """Where the shell gets time from."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def now(self) -> float:
        """Wall-clock seconds since the Unix epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task for `seconds` of this clock's time (<= 0: just yield)."""
        ...


class RealClock:
    """The process's clocks: `time.monotonic`, `time.time` and `asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class ManualClock:
    """A clock that moves only when told to; see the module docstring for its semantics.

    Invariants: `_sleepers` is a heap of (deadline, seq, future) where seq strictly increases
    with each `sleep` call; a future in it is done only if its sleeper was cancelled (those are
    dropped lazily). `_mono` never decreases.
    """

    DEFAULT_WALL_START = 1_700_000_000.0
    """A fixed, recognisable wall time (2023-11-14T22:13:20Z) so test output is stable."""

    def __init__(self, start: float = 0.0, wall_start: float = DEFAULT_WALL_START) -> None:
        self._mono = float(start)
        self._wall_offset = float(wall_start) - self._mono
        self._seq = itertools.count()
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> float:
        return self._mono + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    def set_wall(self, wall: float) -> None:
        """Step the wall clock to `wall` (an NTP step); monotonic time is unaffected."""
        self._wall_offset = float(wall) - self._mono

    def sleepers(self) -> int:
        """How many tasks are currently sleeping on this clock."""
        self._drop_cancelled()
        return len(self._sleepers)

    def next_deadline(self) -> float | None:
        """The monotonic time of the earliest pending wake-up, if any."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    def advance(self, seconds: float) -> int:
        """Move time forward by `seconds` and wake the sleepers now due; returns how many."""
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        self._mono += seconds
        return self._wake_due()

    async def advance_through(self, seconds: float) -> int:
        """Move forward by `seconds`, stopping at each deadline on the way (see module doc).

        Sleeps begun by woken tasks that fall within the window are honoured too. Returns
        the number of wake-ups.
        """
        if seconds < 0:
            raise ValueError(f"cannot move a clock backwards (advance by {seconds})")
        target = self._mono + seconds
        woken = 0
        while True:
            deadline = self.next_deadline()
            if deadline is None or deadline > target:
                break
            self._mono = max(self._mono, deadline)
            woken += self._wake_due()
            # Let the woken tasks run up to their next await (typically the next sleep).
            await asyncio.sleep(0)
        self._mono = target
        woken += self._wake_due()
        return woken

    def _wake_due(self) -> int:
        woken = 0
        while self._sleepers and self._sleepers[0][0] <= self._mono:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
                woken += 1
        return woken

    def _drop_cancelled(self) -> None:
        if any(f.done() for _, _, f in self._sleepers):
            self._sleepers = [s for s in self._sleepers if not s[2].done()]
            heapq.heapify(self._sleepers)
