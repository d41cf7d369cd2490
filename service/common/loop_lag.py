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

A wake-up can be late for two reasons: this process held its loop (a request's CPU-heavy part
on the loop, or a worker thread holding the GIL), or the machine did not run the process (other
processes on its CPUs). The second is nobody's bug here, and on a shared 2-core test machine
it comes and goes. So each wake also notes the CPU time the loop's own thread used since the
last one (`time.thread_time`), and `tessera_event_loop_busy_stalls_total` counts the stalls
during which that CPU time exceeds `stall_s` too: the loop was busy running something for
longer than the bound, not waiting for a CPU. A thread that is not scheduled uses no CPU time,
so a machine that is merely overloaded moves only `tessera_event_loop_stalls_total`, while work
that holds the loop moves both, however slowly the machine runs it. The whole process's CPU
time would not do: a server busy with many bounded steps (and worker threads) uses CPU all
along, and on a slow machine a late wake then spans a lot of it. What this does not see is a
loop that waits for the GIL while a worker thread holds it in native code, or for a blocking
system call: those count as stalls only.

The CPU time of each interval is kept as well, in the histogram
`tessera_event_loop_busy_seconds`: unlike the lag, it does not grow when the machine is
overloaded, so it shows what a step on the loop costs at any load, well below the stall bound
too (a request whose on-loop part grows with the data it reads shows there long before it
stalls a server).

Stall reports
-------------
The metrics say that the loop was held, not by what. So a watchdog thread looks every interval
at how long ago the loop last woke; once that passes the stall bound it takes the loop thread's
Python stack (`sys._current_frames`) and logs it once per stall, with the CPU time the loop's
thread used meanwhile (its own CPU clock, read from the watchdog) and the whole process's (so a
loop that waited for the GIL while its process's other threads ran is told from a process the
machine did not run), and keeps the last few
(`recent_reports`, `tessera_event_loop_stall_reports_total`). A loop found waiting in its
selector is idle: its wake is late because the machine did not run it, and nothing is
reported. Python switches threads every few milliseconds, so the watchdog runs while the loop
runs Python code; while native code holds the GIL it waits, and the stack it then takes is
where the loop went next, which still names the caller.

The monitor costs one wake per interval (100 ms by default) on the loop and one in the
watchdog: nothing next to a server's heartbeats. It starts with the server and stops with it
(`start` / `aclose`).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from service.common.metrics import MetricsRegistry
from service.common.periodic import Periodic

__all__ = ["LAG_BUCKETS", "LoopLagMonitor", "StallReport"]

log = logging.getLogger(__name__)

LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class StallReport:
    """What the loop was running once it had been held past the stall bound."""

    held_s: float
    """How long since the loop last woke, when the stack was taken."""
    cpu_s: float | None
    """CPU time the loop's thread used meanwhile (None where the platform cannot tell)."""
    stack: str
    """The loop thread's Python stack, innermost call last."""
    process_cpu_s: float = 0.0
    """CPU time the whole process used meanwhile. Far above `cpu_s`: the process's other
    threads ran while the loop waited for the GIL; both small: the machine did not run it."""


_IDLE_FILE = "selectors.py"
"""Where a loop waiting for events sits: a late wake from there is a busy machine."""


class LoopLagMonitor:
    def __init__(
        self,
        registry: MetricsRegistry,
        *,
        stall_s: float,
        interval_s: float = 0.1,
        window_s: float = 60.0,
        report_stalls: bool = True,
    ) -> None:
        self.interval_s = interval_s
        self.report_stalls = report_stalls
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
        self._busy_stalls = registry.counter(
            "tessera_event_loop_busy_stalls_total",
            f"Stalls (wake-ups later than {stall_s:g} s) during which the loop's thread used "
            "more than that much CPU time: work on the loop held it, not a busy machine",
        )
        self._busy = registry.histogram(
            "tessera_event_loop_busy_seconds",
            f"CPU time the event loop's thread used between two wake-ups (asked every "
            f"{interval_s:g} s): how long work on the loop held it, however busy the machine",
            buckets=LAG_BUCKETS,
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
        self._cpu = 0.0
        """The loop thread's CPU time at the last wake-up (`time.thread_time`)."""
        self.max_lag_s = 0.0
        """The largest lag seen since start (tests and the fuzzer read it)."""
        self.listeners: list[Callable[[float, float, float], None]] = []
        """Told every wake-up: (lag_s, cpu_s, now) (the master's heartbeat pacing)."""
        self.recent_reports: deque[StallReport] = deque(maxlen=5)
        """The last stall reports (module docstring)."""
        self._reports = registry.counter(
            "tessera_event_loop_stall_reports_total",
            "Stalls for which the watchdog logged what the loop was running",
        )
        self._last_wake = 0.0
        self._loop_thread = 0
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None

    def observe(self, lag_s: float, now: float, cpu_s: float = 0.0) -> None:
        """Record one wake-up `lag_s` late at monotonic time `now`, the process having used
        `cpu_s` of CPU time on the loop's thread since the previous one."""
        self._hist.observe(lag_s)
        self._busy.observe(cpu_s)
        if lag_s > self.stall_s:
            self._stalls.inc()
            if cpu_s > self.stall_s:
                self._busy_stalls.inc()
        self.max_lag_s = max(self.max_lag_s, lag_s)
        for fn in self.listeners:
            fn(lag_s, cpu_s, now)
        self._recent.append((now, lag_s))
        while self._recent and self._recent[0][0] < now - self.window_s:
            self._recent.popleft()

    def max_recent(self) -> float:
        return max((lag for _, lag in self._recent), default=0.0)

    def _woke(self) -> None:
        now = time.monotonic()
        cpu = time.thread_time()
        self.observe(max(0.0, now - self._asked), now, cpu - self._cpu)
        self._cpu = cpu
        self._asked = time.monotonic() + self.interval_s  # Periodic sleeps this long next
        self._last_wake = now

    def start(self) -> None:
        self._asked = time.monotonic() + self.interval_s
        self._last_wake = time.monotonic()
        self._cpu = time.thread_time()
        self._periodic.start()
        if self.report_stalls:
            self._loop_thread = threading.get_ident()
            self._stop.clear()
            self._watchdog = threading.Thread(
                target=self._watch, name="loop-stall-watchdog", daemon=True
            )
            self._watchdog.start()

    async def aclose(self) -> None:
        self._stop.set()
        await self._periodic.aclose()
        if self._watchdog is not None:
            self._watchdog.join(timeout=5)
            self._watchdog = None

    def _loop_cpu(self) -> float | None:
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(self._loop_thread))
        except (AttributeError, OSError):
            return None

    def _watch(self) -> None:
        """The watchdog thread (module docstring): one report per stall."""
        reported = -1.0
        wake, cpu_at_wake, process_at_wake = self._last_wake, self._loop_cpu(), time.process_time()
        while not self._stop.wait(self.interval_s):
            last = self._last_wake
            if last != wake:
                wake, cpu_at_wake, process_at_wake = last, self._loop_cpu(), time.process_time()
            held = time.monotonic() - last - self.interval_s
            if held <= self.stall_s or reported == last:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                return  # the loop's thread is gone
            stack = "".join(traceback.format_stack(frame, limit=40))
            lines = stack.rstrip().splitlines()
            top = next((ln for ln in reversed(lines) if ln.lstrip().startswith("File ")), "")
            if _IDLE_FILE in top:
                continue  # waiting for events: the machine was slow to run it
            reported = last
            now_cpu = self._loop_cpu()
            cpu = None if now_cpu is None or cpu_at_wake is None else now_cpu - cpu_at_wake
            process = time.process_time() - process_at_wake
            report = StallReport(held, cpu, stack, process)
            self.recent_reports.append(report)
            self._reports.inc()
            log.warning(
                "event loop held for %.2f s so far (stall bound %.2f s; its thread used %s of "
                "CPU meanwhile, the whole process %.2f s); it is running:\n%s",
                held,
                self.stall_s,
                "?" if cpu is None else f"{cpu:.2f} s",
                process,
                stack,
            )
