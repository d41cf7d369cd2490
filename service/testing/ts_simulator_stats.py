"""The tablet-server simulator's statistics file (`--stats-file`): heartbeat latencies and the
fleet's replica and leader counts, written every second for benchmarks to read.

The counts come from per-server counters the simulator keeps at each change, and the latencies
are sorted in a worker thread: sorting 50,000 of them on the loop once a second stalled every
heartbeat in flight, and the stall showed in the very p99 being measured.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, deque
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "RECENT_S",
    "FleetCounters",
    "dump_stats",
    "stats_inputs",
    "write_stats_every_second",
    "write_stats_file",
]

RECENT_S = 10.0
"""The window of the `recent_*` heartbeat statistics (a benchmark's steady-state window)."""


class FleetCounters(Protocol):
    """What the statistics read of the simulator (ts_simulator.FleetSimulator keeps them),
    named here so that this module does not import the simulator that writes them."""

    @property
    def heartbeat_latencies(self) -> list[float]: ...
    @property
    def recent_latencies(self) -> deque[tuple[float, float]]: ...
    @property
    def rounds(self) -> int: ...
    @property
    def heartbeats_failed(self) -> int: ...
    @property
    def heartbeat_errors(self) -> Counter[str]: ...
    @property
    def reported(self) -> Counter[str]: ...
    @property
    def copies_triggered(self) -> int: ...

    def tablet_counts(self) -> tuple[int, int]: ...


def dump_stats(sim: FleetCounters, path: Path) -> None:
    write_stats_file(path, stats_inputs(sim))


def stats_inputs(sim: FleetCounters) -> dict[str, Any]:
    """What the statistics are computed from, copied on the loop (cheap: no sorting)."""
    replicas, leaders = sim.tablet_counts()
    return {
        "latencies": sim.heartbeat_latencies[-50_000:],
        "recent": [x for _, x in sim.recent_latencies],
        "rounds": sim.rounds,
        "heartbeats": len(sim.heartbeat_latencies),
        "failed": sim.heartbeats_failed,
        "errors": dict(sim.heartbeat_errors),
        "replicas": replicas,
        "leaders": leaders,
        "reported": dict(sim.reported),
        "copies_triggered": sim.copies_triggered,
    }


def write_stats_file(path: Path, inputs: dict[str, Any]) -> None:
    lat = sorted(inputs.pop("latencies"))
    recent = sorted(inputs.pop("recent"))
    stats = {
        **inputs,
        "p99_s": lat[int(0.99 * (len(lat) - 1))] if lat else 0.0,
        "recent_s": RECENT_S,
        "recent_heartbeats": len(recent),
        "recent_p99_s": recent[int(0.99 * (len(recent) - 1))] if recent else 0.0,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stats))
    tmp.replace(path)


async def write_stats_every_second(sim: FleetCounters, path: Path) -> None:
    """Until cancelled; sorted in a worker thread (module docstring)."""
    while True:
        await asyncio.sleep(1.0)
        await asyncio.to_thread(write_stats_file, path, stats_inputs(sim))
