"""The loop-lag monitor's watchdog names what held the event loop (service/common/loop_lag.py):
a real asyncio loop, a coroutine that holds it with CPU work, then one that only sleeps."""

from __future__ import annotations

import asyncio
import time

from service.common.loop_lag import LoopLagMonitor
from service.common.metrics import MetricsRegistry


def _hold_the_loop_with_arithmetic(seconds: float) -> int:
    n = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        n += 1
    return n


def test_a_held_loop_is_reported_once_with_the_code_that_held_it() -> None:
    async def main() -> LoopLagMonitor:
        mon = LoopLagMonitor(MetricsRegistry(), stall_s=0.2, interval_s=0.05)
        mon.start()
        try:
            await asyncio.sleep(0.2)
            _hold_the_loop_with_arithmetic(0.8)
            await asyncio.sleep(0.3)
            await asyncio.sleep(0.5)  # idle: nothing to report
        finally:
            await mon.aclose()
        return mon

    mon = asyncio.run(main())
    # One report for the one stall (a busy machine may add one for a late wake elsewhere).
    held = [r for r in mon.recent_reports if "_hold_the_loop_with_arithmetic" in r.stack]
    assert len(held) == 1, [r.stack[-300:] for r in mon.recent_reports]
    (report,) = held
    assert report.held_s > 0.2
    assert report.cpu_s is None or report.cpu_s > 0.1  # busy, not starved of a CPU
    # The process's CPU includes the loop thread's (read a moment apart: some slack).
    assert report.process_cpu_s > 0.1
    assert report.cpu_s is None or report.process_cpu_s >= report.cpu_s - 0.05


def test_no_watchdog_when_switched_off() -> None:
    async def main() -> LoopLagMonitor:
        mon = LoopLagMonitor(MetricsRegistry(), stall_s=0.1, interval_s=0.05, report_stalls=False)
        mon.start()
        _hold_the_loop_with_arithmetic(0.4)
        await asyncio.sleep(0.1)
        await mon.aclose()
        return mon

    assert not asyncio.run(main()).recent_reports
