"""Clocks: ManualClock wakes sleepers deterministically; RealClock behaves like time."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.common.clock import Clock, ManualClock, RealClock


def test_both_clocks_satisfy_the_protocol() -> None:
    assert isinstance(RealClock(), Clock)
    assert isinstance(ManualClock(), Clock)


def test_manual_clock_moves_only_when_advanced() -> None:
    clock = ManualClock(start=10.0, wall_start=1000.0)
    assert (clock.monotonic(), clock.now()) == (10.0, 1000.0)
    clock.advance(2.5)
    assert (clock.monotonic(), clock.now()) == (12.5, 1002.5)
    clock.set_wall(50.0)  # an NTP step: wall jumps back, monotonic does not
    assert (clock.monotonic(), clock.now()) == (12.5, 50.0)
    clock.advance(1.0)
    assert (clock.monotonic(), clock.now()) == (13.5, 51.0)
    with pytest.raises(ValueError):
        clock.advance(-1.0)


def test_sleepers_wake_in_deadline_order_ties_in_sleep_order() -> None:
    async def main() -> list[str]:
        clock = ManualClock()
        woke: list[str] = []

        async def sleeper(name: str, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append(f"{name}@{clock.monotonic():g}")

        tasks = [
            asyncio.create_task(sleeper(name, seconds))
            for name, seconds in [("c", 3.0), ("a", 1.0), ("b1", 2.0), ("b2", 2.0), ("d", 9.0)]
        ]
        await asyncio.sleep(0)  # let every task reach its sleep
        assert clock.sleepers() == 5 and clock.next_deadline() == 1.0

        assert clock.advance(0.5) == 0
        await asyncio.sleep(0)
        assert woke == []

        assert clock.advance(1.5) == 3  # now 2.0: a, b1, b2 (deadline <= now)
        await asyncio.sleep(0)
        assert clock.advance(1.0) == 1  # now 3.0: c, exactly at its deadline
        await asyncio.sleep(0)
        assert clock.sleepers() == 1
        tasks[-1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert clock.sleepers() == 0
        assert clock.advance(100.0) == 0  # the cancelled sleeper is not woken
        return woke

    assert asyncio.run(main()) == ["a@2", "b1@2", "b2@2", "c@3"]


def test_order_is_deterministic_across_runs() -> None:
    async def main() -> list[int]:
        clock = ManualClock()
        woke: list[int] = []

        async def sleeper(i: int) -> None:
            await clock.sleep((i * 7) % 5 + 1)
            woke.append(i)

        tasks = [asyncio.create_task(sleeper(i)) for i in range(20)]
        await asyncio.sleep(0)
        clock.advance(10.0)
        await asyncio.gather(*tasks)
        return woke

    first = asyncio.run(main())
    assert first == sorted(range(20), key=lambda i: ((i * 7) % 5, i))
    assert all(asyncio.run(main()) == first for _ in range(5))


def test_zero_sleep_yields_without_waiting_for_time() -> None:
    async def main() -> float:
        clock = ManualClock()
        await clock.sleep(0)
        await clock.sleep(-1)
        return clock.monotonic()

    assert asyncio.run(main()) == 0.0


def test_advance_wakes_a_periodic_loop_once_advance_through_once_per_period() -> None:
    async def main() -> tuple[list[float], list[float]]:
        clock = ManualClock()
        ticks: list[float] = []

        async def every_half_second() -> None:
            while True:
                await clock.sleep(0.5)
                ticks.append(clock.monotonic())

        task = asyncio.create_task(every_half_second())
        await asyncio.sleep(0)
        clock.advance(2.0)  # a jump: the loop fires once, at the final time
        await asyncio.sleep(0)
        jumped = list(ticks)
        ticks.clear()
        await clock.advance_through(2.0)  # steps: once per period, each at its deadline
        await asyncio.sleep(0)
        stepped = list(ticks)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return jumped, stepped

    jumped, stepped = asyncio.run(main())
    assert jumped == [2.0]
    assert stepped == [2.5, 3.0, 3.5, 4.0]


def test_sleep_deadline_is_relative_to_when_it_began() -> None:
    async def main() -> float:
        clock = ManualClock()
        clock.advance(5.0)
        task = asyncio.create_task(clock.sleep(1.0))
        await asyncio.sleep(0)
        assert clock.next_deadline() == 6.0
        clock.advance(1.0)
        await task
        return clock.monotonic()

    assert asyncio.run(main()) == 6.0


def test_real_clock() -> None:
    clock = RealClock()
    assert abs(clock.now() - time.time()) < 1.0
    start = clock.monotonic()

    async def main() -> None:
        await clock.sleep(0.01)
        await clock.sleep(-1)

    asyncio.run(main())
    assert clock.monotonic() - start >= 0.01
