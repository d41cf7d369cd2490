"""ProgressClock (service/master/progress_clock.py): the master's time stands still while its own
event loop is stalled, so a busy master never declares healthy tablet servers dead (the
starvation spiral, docs/design/failover.md#R8), while a really silent server is still declared dead.

Driven by a ManualClock: `tick()` is what the probe does between stalls.
"""

from __future__ import annotations

import asyncio

import pytest

from service.common.clock import ManualClock
from service.common.errors import InvalidArgument
from service.common.ids import NodeId
from service.master.progress_clock import ProgressClock
from service.master.ts_descriptor import NodeInstance, TSRegistration
from service.master.ts_manager import TSManager

THRESHOLD = 0.5
INTERVAL = 0.1


def clocks() -> tuple[ManualClock, ProgressClock]:
    base = ManualClock(start=1000.0)
    return base, ProgressClock(base, THRESHOLD, INTERVAL)


def run_smoothly(base: ManualClock, clock: ProgressClock, seconds: float) -> None:
    """The loop runs: the probe ticks every INTERVAL."""
    steps = round(seconds / INTERVAL)
    for _ in range(steps):
        base.advance(INTERVAL)
        clock.tick()


def test_without_stalls_progress_time_is_monotonic_time() -> None:
    base, clock = clocks()
    start = clock.monotonic()
    run_smoothly(base, clock, 3.0)
    assert clock.monotonic() - start == pytest.approx(3.0)
    assert clock.stalled_s == 0 and clock.stalls == 0


def test_a_stall_counts_only_up_to_the_threshold() -> None:
    base, clock = clocks()
    start = clock.monotonic()
    base.advance(5.0)  # the loop was blocked for 5 s
    assert clock.monotonic() - start == pytest.approx(THRESHOLD)  # frozen during the stall
    clock.tick()  # the probe runs again
    assert clock.monotonic() - start == pytest.approx(THRESHOLD)  # continuous, no jump
    assert clock.stalled_s == pytest.approx(5.0 - THRESHOLD) and clock.stalls == 1
    run_smoothly(base, clock, 1.0)
    assert clock.monotonic() - start == pytest.approx(THRESHOLD + 1.0)


def test_progress_time_never_decreases() -> None:
    base, clock = clocks()
    seen = [clock.monotonic()]
    for gap in (0.05, 0.7, 0.2, 3.0, 0.49, 0.51, 10.0):
        base.advance(gap / 2)
        seen.append(clock.monotonic())
        base.advance(gap / 2)
        seen.append(clock.monotonic())
        clock.tick()
        seen.append(clock.monotonic())
    assert seen == sorted(seen)


def test_wall_time_is_the_base_clocks() -> None:
    base, clock = clocks()
    base.advance(7.0)
    assert clock.now() == base.now()


@pytest.mark.parametrize(
    ("threshold", "interval", "field"),
    [(0.0, None, "stall_threshold_s"), (0.5, 0.5, "interval_s"), (0.5, 0.0, "interval_s")],
)
def test_bad_settings_are_refused_naming_the_field(
    threshold: float, interval: float | None, field: str
) -> None:
    with pytest.raises(InvalidArgument, match=field):
        ProgressClock(ManualClock(), threshold, interval)


def test_the_probe_ticks_until_cancelled() -> None:
    async def go() -> None:
        base, clock = clocks()
        probe = asyncio.create_task(clock.run())
        await asyncio.sleep(0)
        await base.advance_through(2.0)  # the probe wakes every INTERVAL: no stall
        assert clock.stalls == 0
        base.advance(3.0)  # nobody ran for 3 s
        await asyncio.sleep(0)
        assert clock.stalls == 1
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe

    asyncio.run(go())


# --- through the TSManager ---------------------------------------------------------------------

TIMEOUT = 3.0


def fleet(clock: ProgressClock | ManualClock) -> TSManager:
    ts = TSManager(clock, TIMEOUT)
    for i in range(3):
        uuid = NodeId(f"ts-{i}")
        ts.register(NodeInstance(uuid, 1), TSRegistration((f"10.0.0.{i}:7050",)))
    return ts


@pytest.mark.parametrize("progress", [True, False])
def test_a_master_stall_does_not_make_healthy_servers_dead(progress: bool) -> None:
    base, clock = clocks()
    ts = fleet(clock if progress else base)
    run_smoothly(base, clock, 1.0)
    base.advance(10.0)  # the master's loop is blocked; the servers heartbeat on time meanwhile
    # The first thing the master does afterwards, before reading the queued heartbeats:
    assert ts.num_live() == (3 if progress else 0)


def test_a_silent_server_is_still_declared_dead_and_counted_when_it_returns() -> None:
    base, clock = clocks()
    ts = fleet(clock)
    for _ in range(round(2 * TIMEOUT / INTERVAL)):  # a smooth master; ts-2 never heartbeats
        base.advance(INTERVAL)
        clock.tick()
        for u in ("ts-0", "ts-1"):
            ts.heartbeat(NodeInstance(NodeId(u), 1))
    assert sorted(d.uuid for d in ts.descriptors() if not d.live) == ["ts-2"]
    assert ts.revivals == 0
    ts.heartbeat(NodeInstance(NodeId("ts-2"), 1))
    assert ts.num_live() == 3 and ts.revivals == 1
