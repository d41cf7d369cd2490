"""The asyncio readers-writer lock (service/common/rwlock.py): shared holders together, an
exclusive one alone, grants in arrival order, and cancellation that never leaks a grant."""

from __future__ import annotations

import asyncio

import pytest

from service.common.rwlock import RWLock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_shared_holders_run_together_and_an_exclusive_one_alone() -> None:
    async def main() -> None:
        lock = RWLock()
        log: list[str] = []
        release = asyncio.Event()

        async def reader(name: str) -> None:
            async with lock.shared():
                log.append(f"+{name}")
                await release.wait()
                log.append(f"-{name}")

        async def writer() -> None:
            async with lock.exclusive():
                log.append("+w")
                assert lock.readers == 0 and lock.writer
                log.append("-w")

        tasks = [asyncio.create_task(reader("a")), asyncio.create_task(reader("b"))]
        await settle()
        assert lock.readers == 2 and log == ["+a", "+b"]
        tasks.append(asyncio.create_task(writer()))
        await settle()
        assert "+w" not in log  # waits for both readers
        release.set()
        await asyncio.gather(*tasks)
        assert log[-2:] == ["+w", "-w"] and not lock.writer and lock.readers == 0

    asyncio.run(main())


def test_a_waiting_writer_holds_back_later_readers_which_then_go_together() -> None:
    async def main() -> None:
        lock = RWLock()
        order: list[str] = []
        first = asyncio.Event()

        async def hold_shared() -> None:
            async with lock.shared():
                await first.wait()

        async def take(name: str, exclusive: bool) -> None:
            async with lock.exclusive() if exclusive else lock.shared():
                order.append(name)
                await asyncio.sleep(0)

        holder = asyncio.create_task(hold_shared())
        await settle()
        tasks = [
            asyncio.create_task(take("w1", True)),
            asyncio.create_task(take("r1", False)),
            asyncio.create_task(take("r2", False)),
            asyncio.create_task(take("w2", True)),
        ]
        await settle()
        assert order == []  # r1 and r2 arrived after w1: they wait although only readers hold
        first.set()
        await asyncio.gather(holder, *tasks)
        assert order == ["w1", "r1", "r2", "w2"]

    asyncio.run(main())


@pytest.mark.parametrize("exclusive", [True, False])
def test_a_task_cancelled_while_waiting_leaves_the_lock_as_it_was(exclusive: bool) -> None:
    async def main() -> None:
        lock = RWLock()
        release = asyncio.Event()

        async def hold() -> None:
            async with lock.exclusive():
                await release.wait()

        async def wait_for_it() -> None:
            async with lock.exclusive() if exclusive else lock.shared():
                raise AssertionError("never granted")

        holder = asyncio.create_task(hold())
        await settle()
        waiter = asyncio.create_task(wait_for_it())
        await settle()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        release.set()
        await holder
        assert not lock.writer and lock.readers == 0
        async with lock.exclusive():  # free, not leaked to the cancelled task
            pass

    asyncio.run(main())


def test_a_grant_to_a_task_cancelled_before_it_ran_is_given_back() -> None:
    async def main() -> None:
        lock = RWLock()
        entered = False

        async def wait_for_it() -> None:
            nonlocal entered
            async with lock.exclusive():
                entered = True

        async with lock.shared():
            waiter = asyncio.create_task(wait_for_it())
            await settle()
        # The reader's release granted the lock to the waiter; cancel it before it runs.
        assert lock.writer
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not entered and not lock.writer
        async with lock.shared():
            assert lock.readers == 1

    asyncio.run(main())
