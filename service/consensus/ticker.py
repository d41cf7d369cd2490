"""One tick timer per process for all its Raft groups.

Theory of operation
-------------------
A Raft core counts time in ticks (`RawNode.tick`): elections and heartbeats are so many ticks
apart. A tablet server runs hundreds of groups; if each kept its own timer, each would tick at
its own phase, and every leader's heartbeats would leave alone: one gRPC write per group per
heartbeat, which on the 2-core benchmark machine made 100 idle tablets cost a quarter of a core
per server. So the groups of a process share one `Ticker` per tick interval: it fires once per
interval and marks every registered node due (`RaftNode._tick_timer`, which only sets a flag
and wakes the node's own task: each node still ticks its own core, as the one owner of it).
All of them then tick in the same loop iteration, their heartbeats reach the transport
together, and each peer's sender packs them into one request (transport.py).

Election timeouts stay randomized per node (the core draws them in ticks), so sharing the
clock makes no two followers campaign at once any more than separate timers would.

A late timer does not burst to catch up: the next fire is one interval after this one, or now.
The timer runs only while some node is registered. Tickers are per event loop (a test may run
several loops one after the other), kept in a weak map so a closed loop's ticker goes with it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

__all__ = ["Ticker", "shared"]


class Ticker:
    """Calls every registered callback once per `interval_s` (module docstring).

    Invariants: `_timer` is set exactly while `_callbacks` is not empty."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._loop = loop
        self.interval_s = interval_s
        self._callbacks: dict[int, Callable[[], None]] = {}
        self._next_id = 0
        self._timer: asyncio.TimerHandle | None = None
        self._next_at = 0.0
        self.fires = 0

    def __len__(self) -> int:
        return len(self._callbacks)

    def add(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Register `callback` (it must not block); returns the function that removes it."""
        key = self._next_id
        self._next_id += 1
        self._callbacks[key] = callback
        if self._timer is None:
            self._next_at = self._loop.time() + self.interval_s
            self._timer = self._loop.call_at(self._next_at, self._fire)

        def remove() -> None:
            self._callbacks.pop(key, None)
            if not self._callbacks and self._timer is not None:
                self._timer.cancel()
                self._timer = None

        return remove

    def _fire(self) -> None:
        self.fires += 1
        self._next_at = max(self._next_at + self.interval_s, self._loop.time())
        self._timer = self._loop.call_at(self._next_at, self._fire)
        for callback in list(self._callbacks.values()):
            callback()


_tickers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Ticker]] = (
    weakref.WeakKeyDictionary()
)


def shared(interval_s: float) -> Ticker:
    """The running loop's ticker for `interval_s`."""
    loop = asyncio.get_running_loop()
    per_loop = _tickers.setdefault(loop, {})
    ticker = per_loop.get(interval_s)
    if ticker is None:
        ticker = per_loop[interval_s] = Ticker(loop, interval_s)
    return ticker
