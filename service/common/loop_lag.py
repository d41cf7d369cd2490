"""How late this process's event loop runs: `tessera_event_loop_lag_seconds`.

Theory of operation
-------------------
Everything a server does (Raft ticks and heartbeats, RPC handlers, applies) shares one asyncio
loop. A request whose CPU-heavy part runs on the loop holds every other task up, and a loop
held for longer than the Raft heartbeat interval makes followers campaign against a healthy
leader. The lag is measured the simple way: a task asks to sleep `interval_s` and records how
much later than asked it woke (`max(0, woke - (slept_at + interval_s))`). Each wake observes
the histogram `tessera_event_loop_lag_seconds`; the gauge
`tessera_event_loop_lag_max_seconds` holds the largest lag of the last `window_s` (so a scrape
every 15 s sees a one-off stall), and `tessera_event_loop_stalls_total` counts wakes later than
`stall_s` (the Raft heartbeat interval by default: the bound a request must not exceed).

The monitor costs one wake per interval (100 ms by default): nothing next to a server's
heartbeats. It starts with the server and stops with it (`start` / `aclose`).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from service.common.metrics import MetricsRegistry
from service.common.periodic import Periodic

__all__ = ["LAG_BUCKETS", "LoopLagMonitor"]

log = logging.getLogger(__name__)

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLagMonitor:
    def __init__(
        self,
        registry: MetricsRegistry,
        *,
        stall_s: float,
        interval_s: float = 0.1,
        window_s: float = 60.0,
    ) -> None:
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.window_s = window_s
        self._hist = registry.histogram(
            "tessera_event_loop_lag_seconds",
            "How much later than asked a periodic wake-up of the event loop ran",
            buckets=LAG_BUCKETS,
        )
        self._stalls = registry.counter(
            "tessera_event_loop_stalls_total",
            f"Wake-ups later than the stall bound ({stall_s:g} s: the Raft heartbeat interval)",
        )
        self._recent: deque[tuple[float, float]] = deque()
        registry.gauge_callback(
            "tessera_event_loop_lag_max_seconds",
            f"The largest event-loop lag of the last {window_s:g} s",
            lambda: [((), self.max_recent())],
        )
        self._periodic = Periodic("loop-lag-monitor", interval_s, self._woke, log)
        self._asked = 0.0
        """When the next wake-up is due (monotonic)."""
        self.max_lag_s = 0.0
        """The largest lag seen since start (tests and the fuzzer read it)."""

    def observe(self, lag_s: float, now: float) -> None:
        """Record one wake-up `lag_s` late at monotonic time `now`."""
        self._hist.observe(lag_s)
        if lag_s > self.stall_s:
            self._stalls.inc()
        self.max_lag_s = max(self.max_lag_s, lag_s)
        self._recent.append((now, lag_s))
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def max_recent(self) -> float:
        return max((lag for _, lag in self._recent), default=0.0)

    def _woke(self) -> None:
        now = time.monotonic()
        self.observe(max(0.0, now - self._asked), now)
        self._asked = time.monotonic() + self.interval_s  # Periodic sleeps this long next

    def start(self) -> None:
        self._asked = time.monotonic() + self.interval_s
        self._periodic.start()

    async def aclose(self) -> None:
        await self._periodic.aclose()
