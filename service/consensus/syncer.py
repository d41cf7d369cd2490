"""A few shared threads that run a Raft node's blocking fdatasync off the event loop, cheaply.

Theory of operation
-------------------
A node must not block its event loop on an fdatasync: while one runs, the loop keeps taking
requests and stepping messages (that is what lets the next group commit grow, node.py). The
obvious tool, `loop.run_in_executor`, costs about 100 µs of CPU per call on this kind of
machine (a concurrent.futures.Future, a work item, futures chained both ways, the executor's
thread accounting); at one call per group commit per node that is a visible share of a loaded
leader's CPU. `SyncThreads` keeps only what the job needs, about 45 µs per call:

  * `submit(fn)` puts (loop, future, fn) on a `queue.SimpleQueue` and returns the future;
  * a worker thread runs `fn` (the GIL is released for the fdatasync itself) and hands the
    result or exception back with one `loop.call_soon_threadsafe`.

One pool per process (`shared()`), started on first use: a tablet server's hundreds of groups
share its threads, so fsyncs of different groups overlap without a thread per group, and a node
never has more than one job in it (node.py waits for one before the next). The threads are
daemons blocked on the queue when idle. A result whose loop was closed meanwhile is dropped:
its node is gone.
"""

from __future__ import annotations

import asyncio
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[[], Any]]


class SyncThreads:
    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.size = threads
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run `fn()` in a pool thread; the future resolves on the calling event loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        if len(self._threads) < self.size:
            self._start()
        self._jobs.put((loop, fut, fn))
        return fut

    def _start(self) -> None:
        with self._lock:
            while len(self._threads) < self.size:
                t = threading.Thread(
                    target=self._work, name=f"raft-sync-{len(self._threads)}", daemon=True
                )
                t.start()
                self._threads.append(t)

    def _work(self) -> None:
        while True:
            loop, fut, fn = self._jobs.get()
            try:
                result = fn()
            except BaseException as e:  # delivered to the waiting node, which stops on it
                _deliver(loop, fut, None, e)
            else:
                _deliver(loop, fut, result, None)


def _deliver(
    loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future[Any],
    result: object,
    error: BaseException | None,
) -> None:
    try:
        loop.call_soon_threadsafe(_settle, fut, result, error)
    except RuntimeError:
        pass  # the loop is closed: nobody is waiting any more


def _settle(fut: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


_shared: SyncThreads | None = None
_shared_lock = threading.Lock()


def shared() -> SyncThreads:
    """The process's pool: a few threads (fsyncs of different files can overlap; more than a
    handful at once only queue in the disk)."""
    global _shared
    if _shared is None:
        with _shared_lock:
            if _shared is None:
                _shared = SyncThreads(min(8, (os.cpu_count() or 1) + 2))
    return _shared
