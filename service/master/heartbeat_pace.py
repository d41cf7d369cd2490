"""Heartbeat pacing by load: a busy leader asks its tablet servers to heartbeat less often.

Theory of operation
-------------------
Every tablet server heartbeats the leader master each `heartbeat_interval_ms`; the master tells
it, in each answer, the interval it wants (`heartbeat_interval_ms`, 0: the server's own). On a
slow or shared host the fleet's heartbeats alone can saturate the leader: its loop runs late,
heartbeats wait to be read, their latency grows past their deadline, and servers retry, which
is more load. So the leader watches its own event loop (the loop-lag monitor's wake-ups,
service/common/loop_lag.py) and, once a period (`period_s`), judges the last period:

  * stretch when the loop woke more than `high_lag_s` late on average, or its thread was busy
    for more than `busy_fraction` of the period (CPU saturated): the asked interval grows by
    half, up to `max_ms`;
  * shrink when the average lag was under `low_lag_s` and the thread was busy for less than
    half of that: the interval falls by a third, back to the servers' own (`base_ms`).

Liveness is unaffected by construction: `max_ms` is at most a quarter of the unresponsive
timeout (as a follower's slower pace, docs/design/failover.md#R1), so a server that heartbeats
at the asked interval is never judged dead, and one that stops still is within the timeout.
Followers already ask for their slower pace; a follower's answer is the larger of the two.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HeartbeatPace"]


@dataclass
class HeartbeatPace:
    """The heartbeat interval the leader asks of tablet servers (module docstring)."""

    base_ms: int
    """The servers' own interval (what 0 means to them)."""
    max_ms: int
    period_s: float = 1.0
    high_lag_s: float = 0.05
    low_lag_s: float = 0.01
    busy_fraction: float = 0.9
    interval: float = 0.0
    """The interval asked now, in ms (0 before the first judgement: the servers' own)."""
    stretches: int = 0
    _start: float | None = None
    _lag_sum: float = 0.0
    _samples: int = 0
    _busy_s: float = 0.0

    def __post_init__(self) -> None:
        self.max_ms = max(self.base_ms, self.max_ms)
        self.interval = float(self.base_ms)

    def observe(self, lag_s: float, cpu_s: float, now: float) -> None:
        """One wake-up of the loop-lag monitor: `lag_s` late, the loop's thread busy `cpu_s`
        since the previous one, at monotonic `now`."""
        if self._start is None:
            self._start = now
        self._lag_sum += lag_s
        self._busy_s += cpu_s
        self._samples += 1
        elapsed = now - self._start
        if elapsed < self.period_s:
            return
        lag = self._lag_sum / self._samples
        busy = self._busy_s / elapsed
        if lag > self.high_lag_s or busy > self.busy_fraction:
            before = self.interval
            self.interval = min(float(self.max_ms), self.interval * 1.5)
            if self.interval > before:
                self.stretches += 1
        elif lag < self.low_lag_s and busy < self.busy_fraction / 2:
            self.interval = max(float(self.base_ms), self.interval / 1.5)
        self._start, self._lag_sum, self._busy_s, self._samples = now, 0.0, 0.0, 0

    def asked_ms(self) -> int:
        """What to put in a heartbeat answer: 0 (the servers' own) unless stretched."""
        ms = int(self.interval)
        return 0 if ms <= self.base_ms else ms
