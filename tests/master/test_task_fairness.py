"""Background tasks are taken one kind at a time in turn: a backlog of one kind never makes
another wait behind it (a dropped 10,000-tablet table's deletes and a new table's creates)."""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from service.common.clock import ManualClock
from service.master.background_tasks import BackgroundTasks


def _tasks(clock: ManualClock) -> BackgroundTasks:
    none: Any = None
    return BackgroundTasks(none, none, none, none, clock, random.Random(0))


def test_a_backlog_of_deletes_does_not_starve_creates() -> None:
    clock = ManualClock()
    bg = _tasks(clock)
    deletes = [("DeleteReplicas", f"old-{i}") for i in range(10_000)]
    creates = [("CreateReplicas", f"new-{i}") for i in range(3)]
    bg._queues = {"DeleteReplicas": deque(deletes), "CreateReplicas": deque(creates)}
    bg._queued = {k: 0.0 for k in deletes + creates}
    clock.advance(12.5)
    assert bg.queue_ages() == {"CreateReplicas": (3, 12.5), "DeleteReplicas": (10_000, 12.5)}
    first = [bg._next_queued() for _ in range(6)]
    assert [k for k in first if k is not None and k[0] == "CreateReplicas"] == creates
    # Then the deletes go on alone, in order.
    assert bg._next_queued() == ("DeleteReplicas", "old-3")


def test_nothing_queued_is_none() -> None:
    bg = _tasks(ManualClock())
    assert bg._next_queued() is None and bg.queue_ages() == {}
