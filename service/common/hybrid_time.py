"""Hybrid time: a hybrid logical clock, and the timestamps it hands out.

Theory of operation
-------------------
Every version of a row carries the *commit timestamp* of the write that made it, and a snapshot
read at timestamp T sees exactly the versions committed at or before T (docs/design/tablets.md
#R3). Timestamps must therefore be totally ordered across a tablet's replicas and across
tablets, agree with causality (a write a client makes after it saw another has a larger
timestamp) and stay close to wall-clock time (so "the table as of 10:00" means something).
A hybrid logical clock gives all three (Kulkarni et al., "Logical Physical Clocks and
Consistent Snapshots in Globally Distributed Databases", 2014; Kudu's HybridClock is the same
idea):

* a timestamp is one unsigned 64-bit integer: the physical part, microseconds since the Unix
  epoch, in the high 52 bits, and a logical counter in the low `LOGICAL_BITS` (12) bits, so
  plain integer order is timestamp order and 4,096 timestamps fit in one microsecond;
* `now()` returns a timestamp larger than every timestamp this clock returned or was told of:
  the wall clock's reading when that is larger, else the last one plus one (the logical
  counter absorbs a clock that stands still or steps back a little);
* `update(ts)` is called with the timestamp carried by every message between servers and from
  clients: afterwards `now()` is larger than `ts`. So a reply, and whatever its receiver does
  next, is ordered after what the sender had done.

The error bound. The physical part may run ahead of this machine's wall clock only by what
messages pushed into it, and wall clocks are assumed to differ by at most
`max_clock_error_us` (a setting, the tablet server's `max_clock_error_ms`, 500 ms by default:
NTP keeps machines within milliseconds, and the bound only has to hold, not be tight). Two
violations are refused with `ClockError` rather than allowed to break the order:

* a timestamp that arrives more than the bound ahead of the local wall clock: accepting it
  would carry this clock, and everything it stamps, that far into the future;
* a wall clock that stepped back by more than the bound below the last timestamp handed out:
  the logical counter would have to carry the clock for longer than the bound says is
  possible, so the machine's clock is broken, and it refuses to assign timestamps until its
  wall clock has caught up, with an error that names the gap.

A third is a wall clock that jumps *forward*: nothing above sees it (the new reading is
simply larger), yet a leader whose clock jumped minutes ahead stamps its writes minutes in the
future, every replica that applies them must follow (a committed stamp is never refused), and
the whole tablet then refuses new timestamps, and reads at the present miss those writes, until
real time catches up. So the clock also keeps the wall and monotonic readings it started with:
the monotonic clock (CLOCK_BOOTTIME on Linux) is slewed by NTP like the wall clock but never
stepped, so the two move together unless the wall clock is stepped (or set). Once the wall
clock has moved more than the bound against the monotonic one, in either direction, the clock
refuses to hand out or check timestamps (`ClockError` naming the jump) until it is back within
the bound; a server restarted once the clock is right starts from the new reading. Entries it
applies are still taken in. (An NTP daemon that steps a running server's clock by more than
the bound, rather than slewing it, trips this too: that server's clock was off by more than
the bound, and it waits for a restart rather than guess which reading is right.)

Nothing here reads the time itself: the wall and monotonic clocks are injected (`wall_us`,
`mono_us`), so tests drive them; a clock given only a wall clock does not watch for jumps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NewType

from service.common.config import TServerConfig
from service.common.errors import ClockError

__all__ = [
    "DEFAULT_MAX_CLOCK_ERROR_US",
    "LOGICAL_BITS",
    "MAX_TIMESTAMP",
    "HybridClock",
    "Timestamp",
    "describe",
    "from_micros",
    "from_millis",
    "logical",
    "physical_us",
]

Timestamp = NewType("Timestamp", int)
"""A hybrid timestamp (module docstring): (microseconds << LOGICAL_BITS) | logical."""

LOGICAL_BITS = 12
_LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_TIMESTAMP = Timestamp((1 << 64) - 1)
"""Larger than every timestamp a clock hands out: "the latest", as a snapshot bound."""
DEFAULT_MAX_CLOCK_ERROR_US = TServerConfig(data_dir=Path("hybrid-clock")).max_clock_error_ms * 1000
"""The bound of a clock given none: a default TServerConfig's (its data_dir is never opened)."""


def physical_us(ts: int) -> int:
    """The physical part of `ts`: microseconds since the Unix epoch."""
    return ts >> LOGICAL_BITS


def logical(ts: int) -> int:
    return ts & _LOGICAL_MASK


def from_micros(us: int, logical_part: int = 0) -> Timestamp:
    return Timestamp((us << LOGICAL_BITS) | logical_part)


def from_millis(ms: int) -> Timestamp:
    """The last timestamp of millisecond `ms`: a snapshot "at ms" sees every write committed
    during that millisecond (kudu-spark's `snapshotTimestampMs` reads the same way)."""
    return Timestamp((((ms + 1) * 1000) << LOGICAL_BITS) - 1)


def describe(ts: int) -> str:
    """`ts` for messages: its UTC time and logical counter."""
    if ts >= MAX_TIMESTAMP:
        return "latest"
    us = physical_us(ts)
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(us // 1_000_000))
    return f"{when}.{us % 1_000_000:06d}Z+{logical(ts)} ({ts})"


def _wall_us() -> int:
    return time.time_ns() // 1000


_BOOTTIME = getattr(time, "CLOCK_BOOTTIME", None)


def _mono_us() -> int:
    """The monotonic clock the wall clock is watched against: Linux's CLOCK_BOOTTIME, which
    counts a suspended machine's sleep like the wall clock does (CLOCK_MONOTONIC does not, and a
    resumed VM would look like a stepped clock); elsewhere the plain monotonic clock."""
    if _BOOTTIME is not None:
        return time.clock_gettime_ns(_BOOTTIME) // 1000
    return time.monotonic_ns() // 1000


class HybridClock:
    """A hybrid logical clock (module docstring). Thread-safe: scans compute snapshot times in
    worker threads while the event loop stamps writes."""

    def __init__(
        self,
        max_error_us: int = DEFAULT_MAX_CLOCK_ERROR_US,
        wall_us: Callable[[], int] = _wall_us,
        mono_us: Callable[[], int] | None = None,
    ) -> None:
        if max_error_us <= 0:
            raise ValueError(f"max_error_us must be positive, got {max_error_us}")
        self.max_error_us = max_error_us
        self._raw_wall_us = wall_us
        if mono_us is None and wall_us is _wall_us:
            mono_us = _mono_us
        self._mono_us = mono_us
        self._anchor = (wall_us(), mono_us()) if mono_us is not None else None
        """(wall, monotonic) at start: how far the wall clock may be from the monotonic one."""
        self._last = 0
        self._lock = threading.Lock()

    def _moved_us(self, wall: int) -> int:
        """How far the wall clock reading `wall` has moved against the monotonic clock since
        this clock started (0 when it does not watch for jumps)."""
        if self._anchor is None or self._mono_us is None:
            return 0
        wall0, mono0 = self._anchor
        return wall - (wall0 + self._mono_us() - mono0)

    def stepped(self) -> bool:
        """Whether the wall clock is now further from the monotonic one than the bound: it was
        stepped or set (module docstring), so this server assigns and checks no timestamp,
        while a server whose clock is right can."""
        return abs(self._moved_us(self._raw_wall_us())) > self.max_error_us

    def _wall_us(self) -> int:
        """The wall clock, once it is known not to have jumped (module docstring)."""
        wall = self._raw_wall_us()
        moved = self._moved_us(wall)
        if abs(moved) > self.max_error_us:
            assert self._anchor is not None
            raise ClockError(
                f"this server's wall clock has moved {moved / 1e6:+.3f} s against its "
                f"monotonic clock since {describe(from_micros(self._anchor[0]))}: more than "
                f"max_clock_error_ms ({self.max_error_us / 1000:.0f} ms). It was stepped "
                "or set; no timestamp is assigned or checked here until it is back "
                "within the bound (restart the server once the clock is right)"
            )
        return wall

    @property
    def last(self) -> Timestamp:
        """The largest timestamp handed out or told of so far (0 before any)."""
        return Timestamp(self._last)

    def now(self) -> Timestamp:
        """A timestamp larger than any this clock handed out or was told of."""
        with self._lock:
            wall = self._wall_us()
            last_us = self._last >> LOGICAL_BITS
            if last_us - wall > self.max_error_us:
                raise ClockError(
                    f"the wall clock reads {describe(from_micros(wall))}, "
                    f"{(last_us - wall) / 1000:.1f} ms behind the last timestamp "
                    f"{describe(self._last)}: more than max_clock_error_ms "
                    f"({self.max_error_us / 1000:.0f} ms). The clock stepped back (or a "
                    "peer's is ahead); no timestamp is assigned until it catches up"
                )
            ts = max(self._last + 1, wall << LOGICAL_BITS)
            self._last = ts
            return Timestamp(ts)

    def update(self, ts: int) -> None:
        """Take in a timestamp carried by a message: `now()` is larger from here on.

        ClockError, changing nothing, if `ts` is more than the error bound ahead of the wall
        clock (module docstring)."""
        if ts <= self._last:
            return
        with self._lock:
            if ts <= self._last:
                return
            if ts >= MAX_TIMESTAMP:
                raise ClockError(f"timestamp {ts} is not a hybrid time")
            wall = self._wall_us()
            ahead = (ts >> LOGICAL_BITS) - wall
            if ahead > self.max_error_us:
                raise ClockError(
                    f"timestamp {describe(ts)} is {ahead / 1000:.1f} ms ahead of this "
                    f"server's wall clock, more than max_clock_error_ms "
                    f"({self.max_error_us / 1000:.0f} ms): refused, or every timestamp "
                    "assigned here would be that far in the future"
                )
            self._last = ts

    def observe(self, ts: int) -> bool:
        """Take in the timestamp of a committed log entry this replica applies: unlike
        `update`, never refused (the entry is part of the order already, and whoever stamps
        next, this replica as a future leader included, must stamp after it). Returns whether
        `ts` was further ahead of the wall clock than the bound (the caller says so)."""
        if ts <= self._last:
            return False
        with self._lock:
            if ts > self._last:
                self._last = ts
            return (ts >> LOGICAL_BITS) - self._raw_wall_us() > self.max_error_us

    def check(self, ts: int) -> None:
        """ClockError if `ts` is further ahead of the wall clock than the bound allows (a
        requested snapshot in the future); else nothing. The clock is not moved."""
        ahead = (ts >> LOGICAL_BITS) - self._wall_us()
        if ts < MAX_TIMESTAMP and ahead > self.max_error_us:
            raise ClockError(
                f"timestamp {describe(ts)} is {ahead / 1000:.1f} ms in the future of this "
                f"server's clock (max_clock_error_ms {self.max_error_us / 1000:.0f})"
            )
