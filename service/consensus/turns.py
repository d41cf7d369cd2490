"""Turns on the event loop for the applies of a process's Raft groups.

Theory of operation
-------------------
asyncio runs, in one pass, every callback that was ready when the pass began; timers that fell
due and I/O that arrived meanwhile run after them. So what holds a loop up is not one task's
step but everything ready at once. A client write fanned out to 60 tablets of one server makes
60 groups commit together: each group's apply is a single bounded step (a Write carries at most
`row_ops.MAX_WRITE_ROWS` rows), but the 60 steps land in the same pass, and the loop's timers
(the Raft ticker, the loop-lag probe, service/common/loop_lag.py) waited behind all of them:
0.7 s for 10,000 rows per tablet, over 2 s for 50,000, with leaders missing heartbeats.

`Turns` cuts such a pile into slices of about `slice_s` seconds. Before applying a committed
entry a node asks for a turn (`RaftNode._apply_ready`); while the slice that began when the
first of them asked has time left, it goes on at once (one clock read). Past that, it yields
(`asyncio.sleep(0)`), behind the timers and I/O that came due, and a new slice begins with the
next pass. Each pass then does at most one slice of applies plus one step, and the timers and
I/O between: the loop wakes late by about that, however many groups commit at once.

Order and atomicity are untouched: a node asks before each entry, never within one, so entries
still apply whole and in log order, and a node's loop task is the only one that applies its
entries. What waits is the rest of that node's iteration (its next messages wait in its inbox,
as they do while it applies). A node whose entries are cheap takes its turns without yielding,
so a lone write costs nothing more. Turns are per event loop (as `ticker.Ticker` is).
"""

from __future__ import annotations

import asyncio
import time
import weakref

__all__ = ["Turns", "shared"]


class Turns:
    """Slices of at most about `slice_s` seconds of applies per loop pass (module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, slice_s: float) -> None:
        if not slice_s > 0:
            raise ValueError(f"slice_s must be > 0, got {slice_s}")
        self._loop = loop
        self.slice_s = slice_s
        self._began: float | None = None
        """perf_counter() when the current slice began; None until someone asks again."""
        self.yields = 0
        """How many times a node yielded for a new slice (tests read it)."""

    def _new_slice(self) -> None:
        self._began = None

    async def turn(self) -> None:
        """Return when the caller may run one bounded step: at once within the current slice,
        else after yielding to what else the loop has ready."""
        while True:
            now = time.perf_counter()
            if self._began is None:
                self._began = now
                # Runs at the start of the next pass, before the nodes that yield now resume.
                self._loop.call_soon(self._new_slice)
            if now - self._began < self.slice_s:
                return
            self.yields += 1
            await asyncio.sleep(0)


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, Turns]] = (
    weakref.WeakKeyDictionary()
)


def shared(slice_s: float) -> Turns:
    """The running loop's `Turns` of `slice_s`."""
    loop = asyncio.get_running_loop()
    per_loop = _turns.setdefault(loop, {})
    turns = per_loop.get(slice_s)
    if turns is None:
        turns = per_loop[slice_s] = Turns(loop, slice_s)
    return turns
