"""Tablet-report writes proposed at about the same time go to sys.catalog as ONE entry.

Why. A 10,000-tablet CreateTable on 1,000 servers turns RUNNING through the reports of each
tablet's new leader. Each server reports once a second what changed since, which is about one
new leader per report, so the leader wrote one sys.catalog entry per tablet: about 9,000
entries for one table, each appended, fsynced, sent to both followers, acknowledged and applied
three times over. Entries cost far more than the rows in them. Reports that are written
together (the report gate lets dozens run at once) are independent: each changes only the
tablet rows it holds the locks of (`ReportHandler.process_report`), so their rows are
disjoint and their preconditions are about their own rows.

How. `GroupCommit.replicate(write)` adds the write to the open batch and returns the result
of the entry that carried it. The open batch is proposed at the end of the current step of
the event loop (so every write added in that step rides along), or when it reaches `max_ops`
row changes, or when a write names a row already in it (never two changes of one row in one
entry, whatever the callers' locking). At most `max_in_flight` batches are being replicated
at once; while they are, new writes gather in the open batch, so the busier the leader, the
larger its entries (group commit, as databases do for their log's fsyncs).

A combined entry commits or is refused as a whole. If it is refused (a precondition failed:
one report's view of a row went stale), each of its writes is proposed again on its own, so
one stale write costs the others only a second entry, never their acknowledgement. A
replication error (lost leadership, a timeout) is every write's error: none of them is known
to have committed, and each report is sent again by its server.

Only writes without a request id go through here (report writes): a DDL write's remembered
answer belongs to its own entry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from service.common.errors import ResourceExhausted
from service.master.catalog_records import CatalogWrite, RowKey, record_key
from service.master.catalog_records import Delete as DeleteOp
from service.master.sys_catalog import ApplyResult

__all__ = ["GroupCommit"]

log = logging.getLogger(__name__)

Propose = Callable[[CatalogWrite], Awaitable[ApplyResult]]
"""Replicate one write and wait until applied; a refusal is returned in the result (not
raised), replication errors are raised."""


@dataclass
class _Batch:
    writes: list[tuple[CatalogWrite, asyncio.Future[ApplyResult]]] = field(default_factory=list)
    keys: set[RowKey] = field(default_factory=set)
    ops: int = 0


def _keys(write: CatalogWrite) -> set[RowKey]:
    return {op.key if isinstance(op, DeleteOp) else record_key(op.record) for op in write.ops}


class GroupCommit:
    """Report writes combined into shared entries (module docstring).

    Invariants: `_open` holds only writes whose callers still wait (a caller cancelled before
    its batch left is dropped from it); its row keys are disjoint; `in_flight` counts the
    batches being replicated, at most `max_in_flight`."""

    def __init__(self, propose: Propose, *, max_in_flight: int = 4, max_ops: int = 512) -> None:
        if max_in_flight < 1 or max_ops < 1:
            raise ValueError(f"max_in_flight and max_ops must be >= 1: {max_in_flight}, {max_ops}")
        self._propose = propose
        self.max_in_flight = max_in_flight
        self.max_ops = max_ops
        self.in_flight = 0
        self.entries = 0
        """Entries proposed (combined or single)."""
        self.writes = 0
        """Writes carried by them."""
        self._open = _Batch()
        self._scheduled = False
        self._full: list[_Batch] = []
        """Batches closed early (full, or a repeated row) waiting for a free slot, in order."""
        self._tasks: set[asyncio.Task[None]] = set()

    async def replicate(self, write: CatalogWrite) -> ApplyResult:
        """The result of the entry that carried `write` (its refusal, if its own write was
        refused; see the module docstring). Replication errors are raised."""
        if write.request_id is not None:
            raise ValueError("group commit carries only writes without a request id")
        keys = _keys(write)
        if self._open.writes and (
            self._open.ops + len(write.ops) > self.max_ops or not self._open.keys.isdisjoint(keys)
        ):
            self._full.append(self._open)
            self._open = _Batch()
        fut: asyncio.Future[ApplyResult] = asyncio.get_running_loop().create_future()
        self._open.writes.append((write, fut))
        self._open.keys |= keys
        self._open.ops += len(write.ops)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        """Send batches while slots are free: the closed ones first, then the open one."""
        self._scheduled = False
        while self.in_flight < self.max_in_flight:
            if self._full:
                batch = self._full.pop(0)
            elif self._open.writes:
                batch, self._open = self._open, _Batch()
            else:
                return
            live = [(w, f) for w, f in batch.writes if not f.done()]  # cancelled callers: dropped
            if not live:
                continue
            self.in_flight += 1
            task = asyncio.ensure_future(self._send(live))
            self._tasks.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self.in_flight -= 1
        if self._full or self._open.writes:
            self._flush()

    async def _send(self, batch: list[tuple[CatalogWrite, asyncio.Future[ApplyResult]]]) -> None:
        if len(batch) == 1:
            await self._one(*batch[0])
            return
        first = batch[0][0]
        combined = CatalogWrite(
            ops=tuple(op for w, _ in batch for op in w.ops),
            expected=tuple(c for w, _ in batch for c in w.expected),
            operation=first.operation,
        )
        self.entries += 1
        self.writes += len(batch)
        try:
            result = await self._propose(combined)
        except ResourceExhausted:
            result = None  # too large after all: each alone
        except BaseException as e:
            for _, fut in batch:
                _settle(fut, error=e)
            if not isinstance(e, Exception):
                raise
            return
        if result is not None and result.ok:
            for _, fut in batch:
                _settle(fut, result=result)
            return
        log.debug("a combined report write of %d writes was refused; each goes alone", len(batch))
        self.writes -= len(batch)
        await asyncio.gather(*(self._one(w, f) for w, f in batch))

    async def _one(self, write: CatalogWrite, fut: asyncio.Future[ApplyResult]) -> None:
        if fut.done():
            return
        self.entries += 1
        self.writes += 1
        try:
            result = await self._propose(write)
        except BaseException as e:
            _settle(fut, error=e)
            if not isinstance(e, Exception):
                raise
            return
        _settle(fut, result=result)


def _settle(
    fut: asyncio.Future[ApplyResult],
    *,
    result: ApplyResult | None = None,
    error: BaseException | None = None,
) -> None:
    if fut.done():
        return
    if error is not None:
        if isinstance(error, asyncio.CancelledError):
            fut.cancel()
        else:
            fut.set_exception(error)
    else:
        assert result is not None
        fut.set_result(result)
