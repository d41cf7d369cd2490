"""A background task that runs a function every interval until it is closed.

For a component's periodic housekeeping (quiescence digests, the tablet-copy trigger,
certificate renewal, the loop-lag probe): the first run comes one interval after `start` (or
`first_after_s`), an exception is logged and the next run comes as usual (a housekeeping bug
must not stop the housekeeping for good), and `aclose` cancels the task and waits for it, so
nothing runs after it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

__all__ = ["Periodic"]


class Periodic:
    def __init__(
        self,
        name: str,
        interval_s: float,
        fn: Callable[[], Awaitable[None] | None],
        log: logging.Logger,
        *,
        first_after_s: float | None = None,
    ) -> None:
        self.name = name
        self.interval_s = interval_s
        self.first_after_s = interval_s if first_after_s is None else first_after_s
        self.fn = fn
        self.log = log
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name=self.name)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        delay = self.first_after_s
        while True:
            await asyncio.sleep(delay)
            delay = self.interval_s
            try:
                result = self.fn()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                self.log.exception("%s failed", self.name)
