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
    assert "tessera_event_loop_busy_stalls_total 0" in _render(reg)


def test_a_stall_is_the_process_s_own_only_when_it_used_the_cpu_meanwhile() -> None:
    reg = MetricsRegistry()
    mon = LoopLagMonitor(reg, stall_s=0.5, window_s=10.0)
    mon.observe(0.9, now=100.0, cpu_s=0.1)  # not scheduled: the machine's
    mon.observe(0.9, now=101.0, cpu_s=0.8)  # busy the whole time: its own
    mon.observe(0.2, now=102.0, cpu_s=0.8)  # busy, but woke in time (other threads)
    text = _render(reg)
    assert "tessera_event_loop_stalls_total 2" in text
    assert "tessera_event_loop_busy_stalls_total 1" in text


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


def test_a_loop_held_by_cpu_work_counts_a_busy_stall() -> None:
    async def main() -> MetricsRegistry:
        reg = MetricsRegistry()
        mon = LoopLagMonitor(reg, stall_s=0.2, interval_s=0.02)
        mon.start()
        await asyncio.sleep(0.1)
        end = time.thread_time() + 0.35
        while time.thread_time() < end:  # CPU work on the loop, however slow the machine
            pass
        await asyncio.sleep(0.1)
        await mon.aclose()
        return reg

    text = _render(asyncio.run(main()))
    assert "tessera_event_loop_busy_stalls_total 1" in text


def test_the_loop_thread_s_cpu_time_of_each_interval_is_a_histogram() -> None:
    reg = MetricsRegistry()
    mon = LoopLagMonitor(reg, stall_s=0.5, window_s=10.0)
    mon.observe(0.9, now=100.0, cpu_s=0.002)  # late, but the loop was idle: the machine's
    mon.observe(0.01, now=101.0, cpu_s=0.07)  # on time, yet a 70 ms step ran on the loop
    text = _render(reg)
    assert "tessera_event_loop_busy_seconds_count 2" in text
    assert 'tessera_event_loop_busy_seconds_bucket{le="0.005"} 1' in text
    assert 'tessera_event_loop_busy_seconds_bucket{le="0.05"} 1' in text
    assert 'tessera_event_loop_busy_seconds_bucket{le="0.1"} 2' in text
