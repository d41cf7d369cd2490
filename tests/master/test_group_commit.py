"""Group commit of tablet-report writes (service/master/group_commit.py) over a real
`SysCatalogState`: writes proposed in one step of the loop share one entry, a refused entry
falls back to one entry per write so only the stale write is refused, rows never repeat in an
entry, batches in flight are bounded, replication errors reach every caller, and a caller that
gives up before its batch leaves is not written."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from service.common.errors import Aborted, NotTheLeader
from service.master.catalog_records import (
    CatalogWrite,
    Insert,
    Precondition,
    RequestId,
    TabletRecord,
    TabletState,
    Update,
    record_key,
)
from service.master.group_commit import GroupCommit
from service.master.sys_catalog import ApplyResult, SysCatalogState
from tests.helpers.sys_catalog import apply_ok, make_consensus, make_table, make_tablets

SERVERS = ["a" * 32, "b" * 32, "c" * 32]


class Log:
    """`propose` over a real state machine: each proposal is the next entry."""

    def __init__(self, state: SysCatalogState, index: int) -> None:
        self.state = state
        self.index = index
        self.entries: list[CatalogWrite] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def __call__(self, write: CatalogWrite) -> ApplyResult:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        self.entries.append(write)
        self.index += 1
        return self.state.apply(self.index, write.encode())


def _catalog(tablets: int = 8) -> tuple[Log, list[TabletRecord]]:
    state = SysCatalogState()
    table = make_table("1" * 32, buckets=tablets)
    ids = iter(f"{i:032x}" for i in range(100, 200))
    rows = make_tablets(table, lambda: next(ids), servers=SERVERS)  # type: ignore[arg-type,return-value]
    apply_ok(state, 1, CatalogWrite(ops=(Insert(table), *(Insert(t) for t in rows))))
    return Log(state, 1), rows


def _running(t: TabletRecord, version: int = 1) -> CatalogWrite:
    """What a report of `t`'s leader writes: RUNNING with a term, if the row is at `version`."""
    new = dataclasses.replace(
        t, state=TabletState.RUNNING, consensus=make_consensus(SERVERS, term=2)
    )
    return CatalogWrite(
        ops=(Update(new),), expected=(Precondition(record_key(t), version),), operation="report"
    )


def _state(log: Log, t: TabletRecord) -> TabletState:
    row = log.state.tablet(t.tablet_id)
    assert row is not None
    return row.record.state


async def _first_held(gc: GroupCommit, log: Log, row: TabletRecord) -> asyncio.Future[ApplyResult]:
    """A first write, held in flight by the log's closed gate (`log.gate.set()` lets it go)."""
    log.gate = asyncio.Event()
    first = asyncio.ensure_future(gc.replicate(_running(row)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert gc.in_flight == 1
    return first


def run(fn: Callable[[], object]) -> None:
    asyncio.run(fn())  # type: ignore[arg-type]


def test_writes_of_one_step_share_one_entry() -> None:
    async def main() -> None:
        log, rows = _catalog()
        gc = GroupCommit(log)
        results = await asyncio.gather(*(gc.replicate(_running(t)) for t in rows))
        assert len(log.entries) == 1 and len(log.entries[0].ops) == len(rows)
        assert {r.index for r in results} == {2} and all(r.ok for r in results)
        assert {_state(log, t) for t in rows} == {TabletState.RUNNING}
        assert (gc.entries, gc.writes) == (1, len(rows))

    run(main)


def test_a_refused_entry_is_retried_write_by_write_and_only_the_stale_one_fails() -> None:
    async def main() -> None:
        log, rows = _catalog(4)
        gc = GroupCommit(log)
        writes = [_running(t) for t in rows[:3]] + [_running(rows[3], version=7)]  # stale
        results = await asyncio.gather(*(gc.replicate(w) for w in writes))
        assert [r.ok for r in results] == [True, True, True, False]
        assert results[3].refusal is not None
        with pytest.raises(Aborted, match=rows[3].tablet_id):
            results[3].raise_for_refusal()
        # The combined entry was refused whole, then each write went alone.
        assert len(log.entries) == 1 + 4
        assert [_state(log, t) for t in rows] == [TabletState.RUNNING] * 3 + [TabletState.CREATING]

    run(main)


def test_a_row_never_appears_twice_in_one_entry() -> None:
    async def main() -> None:
        log, rows = _catalog(2)
        gc = GroupCommit(log)
        first, second = _running(rows[0]), _running(rows[0], version=2)
        results = await asyncio.gather(gc.replicate(first), gc.replicate(second))
        assert [len(e.ops) for e in log.entries] == [1, 1]  # two entries, in order
        assert [r.ok for r in results] == [True, True]

    run(main)


def test_batches_in_flight_are_bounded_and_later_writes_gather() -> None:
    async def main() -> None:
        log, rows = _catalog(8)
        gc = GroupCommit(log, max_in_flight=1)
        first = await _first_held(gc, log, rows[0])
        rest = [asyncio.ensure_future(gc.replicate(_running(t))) for t in rows[1:]]
        for _ in range(3):
            await asyncio.sleep(0)
        assert gc.in_flight == 1 and not log.entries  # waiting for the first batch
        assert log.gate is not None
        log.gate.set()
        await asyncio.gather(first, *rest)
        assert [len(e.ops) for e in log.entries] == [1, 7]

    run(main)


def test_max_ops_closes_a_batch() -> None:
    async def main() -> None:
        log, rows = _catalog(8)
        gc = GroupCommit(log, max_ops=3)
        await asyncio.gather(*(gc.replicate(_running(t)) for t in rows))
        assert [len(e.ops) for e in log.entries] == [3, 3, 2]

    run(main)


def test_a_replication_error_reaches_every_caller_and_writes_nothing() -> None:
    async def main() -> None:
        log, rows = _catalog(4)
        log.fail = NotTheLeader("lost the lease")
        gc = GroupCommit(log)
        results = await asyncio.gather(
            *(gc.replicate(_running(t)) for t in rows), return_exceptions=True
        )
        assert all(isinstance(r, NotTheLeader) for r in results)
        assert {_state(log, t) for t in rows} == {TabletState.CREATING}
        assert gc.in_flight == 0

    run(main)


def test_a_caller_cancelled_before_its_batch_leaves_is_not_written() -> None:
    async def main() -> None:
        log, rows = _catalog(4)
        gc = GroupCommit(log, max_in_flight=1)
        first = await _first_held(gc, log, rows[0])
        gone = asyncio.ensure_future(gc.replicate(_running(rows[1])))
        kept = asyncio.ensure_future(gc.replicate(_running(rows[2])))
        await asyncio.sleep(0)
        gone.cancel()
        assert log.gate is not None
        log.gate.set()
        await asyncio.gather(first, kept)
        assert _state(log, rows[1]) is TabletState.CREATING
        assert _state(log, rows[2]) is TabletState.RUNNING

    run(main)


def test_writes_with_a_request_id_are_not_carried() -> None:
    async def main() -> None:
        log, rows = _catalog(2)
        write = dataclasses.replace(_running(rows[0]), request_id=RequestId("c", 1))
        with pytest.raises(ValueError, match="request id"):
            await GroupCommit(log).replicate(write)

    run(main)


def test_bad_settings_are_refused() -> None:
    async def propose(write: CatalogWrite) -> ApplyResult:
        raise AssertionError

    with pytest.raises(ValueError, match="max_in_flight"):
        GroupCommit(propose, max_in_flight=0)
    with pytest.raises(ValueError, match="max_ops"):
        GroupCommit(propose, max_ops=0)
