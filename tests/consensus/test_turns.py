"""Turns on the event loop for applies (service/consensus/turns.py)."""

from __future__ import annotations

import asyncio

import pytest

from service.consensus import turns


def test_groups_applying_at_once_leave_each_loop_pass_a_bounded_slice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ten groups commit at once, three entries each, every apply costing 20 ms of (simulated)
    # time. Applied straight through, one loop pass runs all 30 before anything else gets the
    # loop. With 50 ms slices, the probe (any other callback: a timer, I/O) runs after at
    # most three of them, and each group still applies its entries in order.
    clock = [0.0]
    monkeypatch.setattr(turns.time, "perf_counter", lambda: clock[0])

    async def main() -> tuple[list[object], int]:
        t = turns.shared(0.05)
        log: list[object] = []
        running = True

        async def group(g: int) -> None:
            for entry in range(3):
                await t.turn()
                clock[0] += 0.02
                log.append((g, entry))

        async def probe() -> None:
            while running:
                log.append("probe")
                await asyncio.sleep(0)

        p = asyncio.create_task(probe())
        await asyncio.gather(*(group(g) for g in range(10)))
        running = False
        await p
        return log, t.yields

    log, yields = asyncio.run(main())
    assert yields > 0
    run = 0
    for item in log:
        run = 0 if item == "probe" else run + 1
        assert run <= 3, log
    for g in range(10):
        assert [e for x, e in (i for i in log if i != "probe") if x == g] == [0, 1, 2]


def test_a_lone_cheap_apply_does_not_yield() -> None:
    async def main() -> int:
        t = turns.shared(0.05)
        for _ in range(100):
            await t.turn()
        return t.yields

    assert asyncio.run(main()) == 0


def test_a_slice_must_be_positive() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="slice_s must be > 0"):
            turns.Turns(loop, 0)
    finally:
        loop.close()
