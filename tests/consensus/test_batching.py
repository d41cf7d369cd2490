"""The pacer (when a leader's next batch may start) and proposal deadlines, on a real event loop
with the RawNode replaced by the three facts the pacer reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from service.common.errors import Timeout
from service.consensus.batching import Deadlines, Pacer
from service.consensus.node import NodeSettings


@dataclass
class FakeRaw:
    """The part of `RawNode` the pacer reads."""

    leader: bool = True
    committed: int = 5
    last: int = 5

    def is_leader(self) -> bool:
        return self.leader

    def commit_index(self) -> int:
        return self.committed

    def last_index(self) -> int:
        return self.last


def pacer(linger: float = 0.2, min_batch: int = 8) -> tuple[Pacer, list[int]]:
    woken: list[int] = []
    settings = NodeSettings(batch_linger_s=linger, linger_min_batch=min_batch)
    return Pacer(settings, lambda: woken.append(1)), woken


def may(p: Pacer, raw: FakeRaw) -> bool:
    r: Any = raw
    return p.may_append(r)


def test_a_leader_appends_only_once_its_log_has_committed() -> None:
    async def main() -> None:
        p, _ = pacer()
        raw = FakeRaw()
        assert may(p, raw)
        raw.last = 6  # a batch in flight
        assert not may(p, raw)
        raw.leader = False  # no longer the leader: its proposals fail at once
        assert may(p, raw)

    asyncio.run(main())


def test_small_batches_never_linger() -> None:
    async def main() -> None:
        p, woken = pacer(linger=10.0, min_batch=8)
        raw = FakeRaw()
        p.appended(7)
        assert may(p, raw)  # 7 < 8 writers: no reason to wait
        p.close()
        assert woken == []

    asyncio.run(main())


def test_after_a_large_batch_the_next_one_waits_out_the_linger() -> None:
    async def main() -> None:
        p, woken = pacer(linger=0.2, min_batch=8)
        raw = FakeRaw()
        loop = asyncio.get_running_loop()
        started = loop.time()
        p.appended(8)
        assert not may(p, raw)  # committed already, but lingering
        assert not may(p, raw)  # asking again arms no second timer
        while not woken:
            await asyncio.sleep(0.01)
        assert woken == [1]
        assert loop.time() - started >= 0.2 - 0.01
        assert may(p, raw)
        raw.last = 6
        assert not may(p, raw)  # lingering never overrides the wait for the commit
        p.close()

    asyncio.run(main())


def test_linger_zero_is_off() -> None:
    async def main() -> None:
        p, _ = pacer(linger=0.0)
        p.appended(1000)
        assert may(p, FakeRaw())

    asyncio.run(main())


def test_deadlines_fail_only_what_is_due_and_forget_what_is_done() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        d = Deadlines()
        soon, later, done = (loop.create_future() for _ in range(3))
        d.add(soon, 0.0)
        d.add(later, 60.0)
        d.add(done, 0.0)
        done.set_result(1)
        d.expire(loop.time())
        with pytest.raises(Timeout, match="outcome unknown"):
            soon.result()
        assert not later.done() and done.result() == 1
        d.clear()
        d.expire(loop.time() + 120)
        assert not later.done()  # forgotten: nothing left to expire
        later.cancel()

    asyncio.run(main())
