"""A cancelled tablet copy waits for its worker thread before closing the file it writes
(`tablet_copy._to_thread_to_the_end`)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.tserver.tablet_copy import _to_thread_to_the_end


def test_a_cancel_waits_for_the_thread_to_finish_before_it_propagates() -> None:
    started, release = threading.Event(), threading.Event()
    finished: list[bool] = []

    def slow_write() -> None:
        started.set()
        assert release.wait(10)
        finished.append(True)

    async def main() -> None:
        task = asyncio.create_task(_to_thread_to_the_end(slow_write))
        await asyncio.to_thread(started.wait, 10)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done(), "the cancel went on while the thread was still writing"
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished == [True]

    asyncio.run(main())


def test_a_result_and_an_error_come_back_as_from_to_thread() -> None:
    def fail() -> None:
        raise OSError("disk full")

    async def main() -> None:
        await _to_thread_to_the_end(lambda: None)
        with pytest.raises(OSError, match="disk full"):
            await _to_thread_to_the_end(fail)

    asyncio.run(main())
