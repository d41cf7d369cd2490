"""A readers-writer lock for asyncio tasks, first come first served.

Theory of operation
-------------------
The catalog manager locks a table before its tablets (the state-change contract,
docs/design/catalog.md#R2). A tablet report or an assignment round changes tablets only, and needs
of the table just that it does not change meanwhile; AlterTable and DeleteTable change the table
itself. With an exclusive table lock, every report of a 10,000-tablet table's replicas waited for
the one before it, a replicated write each: a fleet of 1,000 servers queued its heartbeats behind
one lock until they timed out, and the master declared its servers dead (the starvation spiral,
docs/design/failover.md#R8). Kudu's TableInfo lock is a readers-writer lock for the same reason. So:
`shared()` for writers of tablets, `exclusive()` for writers of the table.

Grants are in arrival order: a waiting exclusive request holds back shared requests that arrive
after it (no writer starvation), and shared requests queued together are granted together. A
task cancelled while waiting leaves the queue; one cancelled just after its grant releases what
it was granted. Everything runs on one event loop: no thread safety.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["RWLock"]


class RWLock:
    """Invariants: `_writer` implies `_readers == 0`; every future in `_waiters` is pending or
    cancelled (granted ones leave the queue as they are granted)."""

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._waiters: deque[tuple[bool, asyncio.Future[None]]] = deque()

    @property
    def readers(self) -> int:
        return self._readers

    @property
    def writer(self) -> bool:
        return self._writer

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        await self._acquire(exclusive=False)
        try:
            yield
        finally:
            self._readers -= 1
            self._grant()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        await self._acquire(exclusive=True)
        try:
            yield
        finally:
            self._writer = False
            self._grant()

    async def _acquire(self, *, exclusive: bool) -> None:
        if not self._waiters and self._free_for(exclusive):
            self._take(exclusive)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((exclusive, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # granted, then cancelled: give it back
                if exclusive:
                    self._writer = False
                else:
                    self._readers -= 1
            self._grant()
            raise

    def _free_for(self, exclusive: bool) -> bool:
        return not self._writer and (not exclusive or self._readers == 0)

    def _take(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = True
        else:
            self._readers += 1

    def _grant(self) -> None:
        """Grant waiters from the front of the queue while they can hold the lock together."""
        while self._waiters:
            exclusive, fut = self._waiters[0]
            if fut.done():  # cancelled while waiting
                self._waiters.popleft()
                continue
            if not self._free_for(exclusive):
                return
            self._waiters.popleft()
            self._take(exclusive)
            fut.set_result(None)
            if exclusive:
                return
