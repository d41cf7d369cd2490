"""SyncThreads: blocking calls run in pool threads, results and errors come back on the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.consensus import syncer
from service.consensus.syncer import SyncThreads


def test_a_job_runs_in_a_pool_thread_and_its_result_resolves_on_the_loop() -> None:
    pool = SyncThreads(2)

    async def main() -> None:
        loop_thread = threading.get_ident()
        ran_in: list[int] = []

        def job() -> int:
            ran_in.append(threading.get_ident())
            return 42

        assert await pool.submit(job) == 42
        assert ran_in and ran_in[0] != loop_thread

    asyncio.run(main())


def test_an_exception_is_raised_to_the_waiter() -> None:
    pool = SyncThreads(1)

    async def main() -> None:
        def fail() -> None:
            raise OSError("fdatasync failed")

        with pytest.raises(OSError, match="fdatasync failed"):
            await pool.submit(fail)
        assert await pool.submit(lambda: "still serving") == "still serving"

    asyncio.run(main())


def test_jobs_of_several_waiters_overlap_up_to_the_pool_size() -> None:
    pool = SyncThreads(2)

    async def main() -> None:
        both = threading.Barrier(2, timeout=10)

        def meet() -> int:
            return both.wait()  # returns only once two jobs run at the same time

        results = await asyncio.wait_for(asyncio.gather(pool.submit(meet), pool.submit(meet)), 10)
        assert sorted(results) == [0, 1]

    asyncio.run(main())


def test_a_result_for_a_closed_loop_is_dropped() -> None:
    pool = SyncThreads(1)
    release = threading.Event()
    finished = threading.Event()

    def slow() -> None:
        release.wait(10)

    async def start() -> None:
        pool.submit(slow)  # never awaited: the loop closes first

    asyncio.run(start())
    release.set()

    async def after() -> None:
        await pool.submit(finished.set)  # the worker survived delivering to a closed loop

    asyncio.run(after())
    assert finished.is_set()


def test_the_process_shares_one_pool() -> None:
    assert syncer.shared() is syncer.shared()
    assert syncer.shared().size >= 1
    with pytest.raises(ValueError):
        SyncThreads(0)
