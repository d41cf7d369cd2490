"""The event-loop lag monitor (service/common/loop_lag.py)."""

from __future__ import annotations

import asyncio
import time

from service.common.loop_lag import LoopLagMonitor
from service.common.metrics import MetricsRegistry


def _render(registry: MetricsRegistry) -> str:
    return registry.render()


def test_observations_feed_the_histogram_the_window_max_and_the_stall_count() -> None:
    reg = MetricsRegistry()
    mon = LoopLagMonitor(reg, stall_s=0.5, window_s=10.0)
    mon.observe(0.01, now=100.0)
    mon.observe(0.7, now=101.0)
    mon.observe(0.02, now=105.0)
    assert mon.max_recent() == 0.7 and mon.max_lag_s == 0.7
    text = _render(reg)
    assert "tessera_event_loop_stalls_total 1" in text
    assert "tessera_event_loop_lag_seconds_count 3" in text
    assert "tessera_event_loop_lag_max_seconds 0.7" in text
    mon.observe(0.03, now=112.0)  # the 0.7 s stall left the 10 s window
    assert mon.max_recent() == 0.03 and mon.max_lag_s == 0.7


def test_a_blocked_loop_is_measured() -> None:
    async def main() -> LoopLagMonitor:
        mon = LoopLagMonitor(MetricsRegistry(), stall_s=0.2, interval_s=0.02)
        mon.start()
        await asyncio.sleep(0.1)
        time.sleep(0.35)  # a request that holds the loop
        await asyncio.sleep(0.1)
        await mon.aclose()
        return mon

    mon = asyncio.run(main())
    assert 0.25 < mon.max_lag_s < 1.0
