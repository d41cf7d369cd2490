"""The process's shared tick timer (service/consensus/ticker.py): every registered node is
marked due in the same loop iteration, once per interval, with no burst after a stall."""

from __future__ import annotations

import asyncio
import time

import pytest

from service.consensus import ticker
from service.consensus.ticker import Ticker


def test_every_callback_fires_once_per_interval_in_the_same_iteration() -> None:
    async def main() -> None:
        t = ticker.shared(0.02)
        assert ticker.shared(0.02) is t and ticker.shared(0.05) is not t
        fired: list[tuple[str, int]] = []
        removers = [t.add(lambda name=name: fired.append((name, t.fires))) for name in "abc"]
        start = time.monotonic()
        await asyncio.sleep(0.11)
        fires = t.fires
        # About one fire per 20 ms, never more: a busy machine may run the loop late (fewer
        # fires, each after a stall), never in bursts.
        assert 1 <= fires <= (time.monotonic() - start) / 0.02 + 1
        # Each fire marks all three, together: one heartbeat write per peer, not three.
        assert fired == [(n, f) for f in range(1, fires + 1) for n in "abc"]
        removers[0]()
        removers[0]()  # removing twice is harmless
        await asyncio.sleep(0.05)
        assert {n for n, f in fired if f > fires} == {"b", "c"}
        for remove in removers[1:]:
            remove()
        assert t._timer is None  # no node, no timer
        before = t.fires
        await asyncio.sleep(0.05)
        assert t.fires == before

    asyncio.run(main())


def test_a_stalled_loop_gets_one_tick_not_a_burst() -> None:
    async def main() -> None:
        t = Ticker(asyncio.get_running_loop(), 0.01)
        remove = t.add(lambda: None)
        time.sleep(0.2)  # the loop is blocked for 20 intervals
        resumed = time.monotonic()
        for _ in range(5):  # turns of the loop: a burst would fire the missed ticks here
            await asyncio.sleep(0)
        await asyncio.sleep(0.015)
        # One fire for the stall, then one per interval that really passed since (a busy
        # machine may stretch this window; a burst would make up for the 20 missed ones).
        assert t.fires <= 2 + (time.monotonic() - resumed) / 0.01
        assert t.fires < 20
        remove()

    asyncio.run(main())


def test_a_ticker_needs_a_positive_interval() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="interval_s"):
            Ticker(loop, 0)
    finally:
        loop.close()
