"""The leader's background tasks: assignment, roll-forward RPCs, re-replication.

See docs/design/coordinator.md (roll-forward from committed state) and docs/design/catalog.md#R7.

Theory of operation
-------------------
One `BackgroundTasks` per leadership term: the master starts it once the new leader has loaded
its catalog and cancels it on any change of role (a deposed leader stops at once; its late
requests are fenced by the term they carry). Nothing it knows survives the term: a new leader
recomputes everything from committed state (roll-forward, docs/design/coordinator.md#R3: the scan
continues in a new leader after failover).

Each round (every `interval_s`, or sooner when the catalog commits something that calls for
work, `CatalogManager.add_work_listener`), in this order:

  1. Assignment: if a tablet is PREPARING, or a CREATING one is past its replacement
     deadline (create_pacing), one `CatalogManager.assign_tablets()` round: ONE replicated
     write that places PREPARING tablets (-> CREATING with their committed config) and
     REPLACES timed-out ones (docs/design/catalog.md#R12, #R13, #R16). A round is bounded
     (`max_tablets_per_assignment_round`); while more is due the next round follows at once.
     A table that cannot be placed waits out a doubling backoff, one warning per attempt
     (`catalog_assignment`, "Bounded rounds" and "Backoff"); the loop sleeps no longer than
     until the next backoff or creation timeout runs out. A failed replication is logged and
     retried next round (KUDU-495: never fatal).
  2. Re-replication (`rereplication`, 3-4-3: docs/design/tablet_copy.md#R7): only when some server
     hosting replicas has been dead longer than the eviction time, or some server reports a replica
     FAILED; ChangeConfig to the tablet's leader, and a tombstone to a FAILED replica once the
     committed config no longer names it.
  3. Side effects: every task of `CatalogManager.pending_tasks()` not already running and not
     waiting out its backoff is started (an RPC whose task committed state stopped calling for
     while it waited for a slot is not sent): CreateTablet on every peer of a CREATING tablet (with
     its schema, partition and initial config with the peers' addresses), DeleteTablet
     (TABLET_DATA_DELETED) on every peer of a DELETED or REPLACED one, AlterSchema to the
     leader of a tablet behind its table's schema. A task whose RPCs all succeeded is reported
     `task_done`; one that failed is retried after a backoff that doubles from
     `retry_initial_s` up to `retry_max_s`. Servers already answered successfully within a
     task are not asked again.
  4. Claim sweep: while some tablet report's leader or config claim waits for its voters'
     confirmation, at most one sweep runs at a time, at most one every `SWEEP_EVERY_S`, beside
     the round: the voters of the claims that waited longest are asked with GetConsensusState
     and the claims they confirm are adopted (claims.py, `CatalogManager.settle_claims`).

Report-driven RPCs (`report_processing` actions: tombstones, deletes, alters of replicas that
reported) arrive through `submit()`; they are sent once (deduplicated while in flight): the
next report from that server triggers them again if needed.

At most `max_concurrent_rpcs` RPCs are in flight at once (a semaphore); a server known to be
dead is not called (its tasks wait for it, or for the assignment timeout to replace the tablet).

Paced creates (create_pacing, docs/design/catalog.md#R16). CreateTablet calls to each server
go through that server's window (`CreatePacer`): a CreateReplicas task starts only when every
server it still has to call has room (the others stay queued, in order), and each call's
deadline follows the server's latency. A server's RESOURCE_EXHAUSTED ("busy, later") halves
its window and retries the task soon without counting a failure; an answer, and a busy
refusal, tell the assigner the tablet is progressing, so a slow server's tablets are not
replaced while it works through them.

Bounded tasks. At most `max_concurrent_rpcs` tasks run at once; the others due wait in a queue,
started as running ones finish. A round never spawns one task per pending tablet: a
10,000-tablet CreateTable would put tens of thousands of coroutines on the event loop at once,
and each loop iteration would then run for long. gRPC's asyncio server accepts one incoming
call per loop iteration, so long iterations, not CPU alone, starved heartbeats: they waited to
be accepted past their deadline (the starvation spiral, docs/design/failover.md#R8).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from random import Random
from typing import Any

from service.common import failpoints
from service.common.clock import Clock
from service.common.config import MasterConfig
from service.common.errors import (
    AlreadyExists,
    NotFound,
    ResourceExhausted,
    TesseraError,
    Timeout,
)
from service.common.ids import NodeId
from service.master.catalog_assignment import (
    AlterReplicas,
    CreateReplicas,
    DeleteReplicas,
    Task,
    TaskKey,
    task_key,
)
from service.master.catalog_manager import CatalogManager
from service.master.catalog_records import ConsensusState, HostPort, MemberType, TabletState
from service.master.claims import ConfirmClaims
from service.master.create_pacing import CreatePacer, Outcome
from service.master.report_processing import (
    AlterReplica,
    ChangeReplicaConfig,
    ConfigChangeType,
    DeleteReplica,
    ReportAction,
    same_config,
)
from service.master.rereplication import plan_failed_cleanup, plan_rereplication
from service.master.ts_manager import TSManager
from service.master.tserver_proxy import Fence, TServerProxy
from service.pb import tserver_pb2 as tpb

__all__ = ["BackgroundSettings", "BackgroundTasks", "TaskView"]

log = logging.getLogger(__name__)

_CHANGE_PB = {
    ConfigChangeType.ADD_PEER: tpb.ChangeConfigRequestPB.ADD_PEER,
    ConfigChangeType.REMOVE_PEER: tpb.ChangeConfigRequestPB.REMOVE_PEER,
    ConfigChangeType.PROMOTE_PEER: tpb.ChangeConfigRequestPB.PROMOTE_PEER,
}


_MASTER_DEFAULTS = MasterConfig(data_dir=Path("background-settings"))
"""MasterConfig with its defaults, the one home of the values below (its data_dir is never
opened)."""


@dataclass(frozen=True)
class BackgroundSettings:
    """Knobs of the background tasks: MasterConfig's, in seconds. The defaults are
    MasterConfig's (`from_config` of a default config), never written here again."""

    interval_s: float = _MASTER_DEFAULTS.bg_task_interval_ms / 1000.0
    retry_initial_s: float = _MASTER_DEFAULTS.task_retry_initial_ms / 1000.0
    retry_max_s: float = _MASTER_DEFAULTS.task_retry_max_ms / 1000.0
    max_concurrent_rpcs: int = _MASTER_DEFAULTS.max_concurrent_tserver_rpcs
    replica_eviction_s: float = _MASTER_DEFAULTS.replica_eviction_timeout_ms / 1000.0

    @classmethod
    def from_config(cls, config: MasterConfig) -> BackgroundSettings:
        return cls(
            interval_s=config.bg_task_interval_ms / 1000.0,
            retry_initial_s=config.task_retry_initial_ms / 1000.0,
            retry_max_s=config.task_retry_max_ms / 1000.0,
            max_concurrent_rpcs=config.max_concurrent_tserver_rpcs,
            replica_eviction_s=config.replica_eviction_timeout_ms / 1000.0,
        )


@dataclass(frozen=True, slots=True)
class TaskView:
    """One task as the status pages show it (`BackgroundTasks.views`)."""

    kind: str
    """CreateReplicas, DeleteReplicas, AlterReplicas, or a report-driven action's class."""
    tablet_id: str
    table_id: str
    targets: tuple[str, ...]
    """The tablet servers the task calls."""
    running: bool
    """An RPC of it is in flight now (otherwise it waits out a backoff)."""
    attempts: int = 0
    """Failed attempts so far."""
    retry_in_s: float | None = None
    answered: tuple[str, ...] = ()
    """Servers that already answered successfully."""


@dataclass
class _Retry:
    task: Task
    attempts: int = 0
    next_at: float = 0.0
    succeeded: set[str] = field(default_factory=set)
    """Servers that already answered this task successfully."""
    reserved: dict[str, float] = field(default_factory=dict)
    """CreateReplicas: the servers whose window this attempt holds a call of, and each
    call's deadline (`CreatePacer.start`, taken when the task is started)."""


_LATER = "later"
"""`_execute`'s answer for a task every server of which answered or said "busy, later"."""

_CREATE_SKIPS = 64
"""CreateReplicas tasks `_drain` looks past (their servers' windows full) before it stops
looking at that kind until the next drain."""


SWEEP_EVERY_S = 1.0
"""The least time between two claim sweeps (step 4 of the module docstring): rounds come sooner
while the catalog commits (every commit that calls for work wakes one), sweeps no sooner."""


class BackgroundTasks:
    """The background tasks of one leadership term (module docstring)."""

    def __init__(
        self,
        catalog: CatalogManager,
        ts_manager: TSManager,
        proxy: TServerProxy,
        fence: Fence,
        clock: Clock,
        rng: Random,
        settings: BackgroundSettings | None = None,
        confirm_claims: ConfirmClaims | None = None,
    ) -> None:
        self.catalog = catalog
        self.confirm_claims = confirm_claims
        """Asks a claimed tablet's voters (GetConsensusState) for the claim sweep (step 4 of
        the module docstring); None: no sweep."""
        self._sweep: asyncio.Task[None] | None = None
        self._swept_at = float("-inf")
        self.claims_adopted = 0
        """Pending claims the sweep adopted (their voters confirmed them when asked)."""
        self.ts = ts_manager
        self.proxy = proxy
        self.fence = fence
        self.clock = clock
        self.rng = rng
        self.settings = settings or BackgroundSettings()
        self._wake = asyncio.Event()
        self.pacer = CreatePacer(min_deadline_s=getattr(proxy, "rpc_timeout_s", 10.0))
        self._sem = asyncio.Semaphore(self.settings.max_concurrent_rpcs)
        self._running: dict[Any, asyncio.Task[None]] = {}
        self._queues: dict[str, deque[TaskKey]] = {}
        """Tasks due and not yet started, by kind (CreateReplicas, AlterReplicas,
        DeleteReplicas), each in the order they became due; `_drain` takes one of each kind in
        turn, so a backlog of one kind (10,000 deletes of a dropped table) never makes another
        (a new table's creates) wait behind it."""
        self._queued: dict[TaskKey, float] = {}
        """Queued keys and when each was queued (monotonic), for queue ages."""
        self._next_kind = 0
        """Where `_drain`'s round robin over the kinds resumes."""
        self._stopped = False
        self._retries: dict[TaskKey, _Retry] = {}
        self._main: asyncio.Task[None] | None = None
        self._remove_listener: Any = None
        self.rounds = 0
        self.rpcs_sent = 0
        self.rpcs_failed = 0
        self.rpcs_skipped = 0
        self.rpcs_shed = 0
        """RPCs a tablet server refused with RESOURCE_EXHAUSTED (busy: retried later)."""
        self.tombstones_unconfirmed = 0
        """Tombstones not sent because a majority of the config's voters did not confirm it."""
        """Task RPCs not sent because the task was no longer called for (see `_rpc`)."""

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._remove_listener = self.catalog.add_work_listener(self.wake)
        self._main = asyncio.create_task(self._run(), name=f"master-bg-{self.fence.master_term}")
        self._main.add_done_callback(_retrieve)

    def stop(self) -> None:
        """Cancel everything at once (a change of role); `aclose` also waits."""
        self._stopped = True
        self._queues.clear()
        self._queued.clear()
        if self._remove_listener is not None:
            self._remove_listener()
            self._remove_listener = None
        if self._main is not None:
            self._main.cancel()
        if self._sweep is not None:
            self._sweep.cancel()
        for t in list(self._running.values()):
            t.cancel()

    async def aclose(self) -> None:
        self.stop()
        tasks = [t for t in [self._main, self._sweep, *self._running.values()] if t is not None]
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def wake(self) -> None:
        self._wake.set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def num_tasks(self) -> int:
        """How many tasks `views` would list, without building them (for /metrics)."""
        return len(self._retries)

    def views(self) -> list[TaskView]:
        """Every task running or waiting to be retried, for the status pages (read-only)."""
        now = self.clock.monotonic()
        out: list[TaskView] = []
        for key, retry in self._retries.items():
            task = retry.task
            out.append(
                TaskView(
                    kind=type(task).__name__,
                    tablet_id=task.tablet_id,
                    table_id=task.table_id,
                    targets=_targets(task),
                    running=key in self._running,
                    attempts=retry.attempts,
                    retry_in_s=max(0.0, retry.next_at - now) if key not in self._running else None,
                    answered=tuple(sorted(retry.succeeded)),
                )
            )
        for key in self._running:
            if isinstance(key, tuple) and len(key) == 4 and key[0] == "report":
                _, kind, tablet_id, target = key
                out.append(TaskView(kind, tablet_id, "", (target,), running=True))
        out.sort(key=lambda v: (v.table_id, v.tablet_id, v.kind))
        return out

    # --- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background tasks: round failed")
            now = self.clock.monotonic()
            due = [now + self.settings.interval_s]
            if self._retries:
                due.append(min(r.next_at for r in self._retries.values()))
            # A backoff or creation timeout running out before the next interval. One already
            # past was due this round: either the round failed (retried after the interval)
            # or it left more work and woke the loop itself.
            assignment_at = self.catalog.next_assignment_at()
            if assignment_at is not None and assignment_at > now:
                due.append(assignment_at)
            timeout = max(0.01, min(due) - now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def round(self) -> None:
        """One round: assignment, re-replication, side effects (module docstring)."""
        self.rounds += 1
        catalog = self.catalog
        if not catalog.loaded:
            return
        if catalog.assignment_due():
            try:
                plan = await catalog.assign_tablets()
                if plan.assigned or plan.replaced:
                    log.info(
                        "assignment: %d tablets placed, %d replaced",
                        len(plan.assigned),
                        len(plan.replaced),
                    )
                for d in plan.deferred:
                    log.warning(
                        "assignment: %d tablets of table %s wait (attempt %d, next in %.1fs): %s",
                        d.tablets,
                        d.table_id,
                        d.attempts,
                        d.retry_in_s,
                        d.reason,
                    )
                if catalog.assignment_due():
                    self.wake()  # a bounded round left work: the next round follows at once
            except TesseraError as e:
                log.warning("assignment round failed (retried next round): %s", e)
        self._rereplicate()
        self._start_tasks()
        self._start_sweep()

    def _start_sweep(self) -> None:
        """Step 4: one claim sweep at a time, beside the round (its GetConsensusState calls
        must not hold up assignment)."""
        if self.confirm_claims is None or (self._sweep is not None and not self._sweep.done()):
            return
        now = self.clock.monotonic()
        if now - self._swept_at < SWEEP_EVERY_S or not self.catalog.pending_claims():
            return
        self._swept_at = now
        self._sweep = asyncio.create_task(self._sweep_claims(self.confirm_claims))
        self._sweep.add_done_callback(_retrieve)

    async def _sweep_claims(self, confirm: ConfirmClaims) -> None:
        try:
            plans = await self.catalog.settle_claims(confirm)
        except TesseraError as e:  # not ready, or the write failed: the next round sweeps again
            log.info("claim sweep: %s", e)
            return
        for plan in plans:
            # A sweep's plan is its claimants' claimed replicas judged again, so the tablets
            # it updated are exactly the claims it adopted.
            self.claims_adopted += len(plan.updated_tablets)
            self.submit(plan.actions)

    def _start_tasks(self) -> None:
        now = self.clock.monotonic()
        pending = self.catalog.pending_tasks()
        keys = set()
        for task in pending:
            key = task_key(task)
            keys.add(key)
            retry = self._retries.get(key)
            if retry is not None and retry.task != task:
                retry = self._retries[key] = _Retry(task)
            if key in self._running or key in self._queued:
                continue
            if retry is not None and now < retry.next_at:
                continue
            if retry is None:
                retry = self._retries[key] = _Retry(task)
            self._queues.setdefault(key[0], deque()).append(key)
            self._queued[key] = now
        for key in [k for k in self._retries if k not in keys and k not in self._running]:
            del self._retries[key]
        self._drain()

    def _drain(self) -> None:
        """Start queued tasks while fewer than `max_concurrent_rpcs` run (module docstring,
        "Bounded tasks"), one of each kind in turn (`_queues`); a task no longer called for,
        or retried meanwhile, is dropped."""
        limit = self.settings.max_concurrent_rpcs
        waiting: list[TaskKey] = []  # creates whose servers' windows are full, in order
        exclude: set[str] = set()
        while len(self._running) < limit and not self._stopped:
            key = self._next_queued(exclude)
            if key is None:
                break
            retry = self._retries.get(key)
            if retry is None or not self.catalog.task_pending(retry.task):
                self._queued.pop(key, None)
                continue
            task = retry.task
            if isinstance(task, CreateReplicas):
                todo = [u for u in task.replicas if u not in retry.succeeded]
                if not self.pacer.has_room(todo):
                    waiting.append(key)  # stays queued, in its place
                    if len(waiting) >= _CREATE_SKIPS:
                        exclude.add(key[0])
                    continue
                retry.reserved = {u: self.pacer.start(NodeId(u)) for u in todo}
            self._queued.pop(key, None)
            self._spawn(key, self._run_task(key, retry))
        for key in reversed(waiting):
            self._queues[key[0]].appendleft(key)

    def _next_queued(self, exclude: set[str] | None = None) -> TaskKey | None:
        """The head of the next non-empty kind's queue (but `exclude`), round robin; None if
        all are empty."""
        kinds = sorted(k for k, q in self._queues.items() if q and not (exclude and k in exclude))
        if not kinds:
            return None
        kind = kinds[self._next_kind % len(kinds)]
        self._next_kind += 1
        return self._queues[kind].popleft()

    def queue_ages(self) -> dict[str, tuple[int, float]]:
        """Per task kind: (tasks queued, seconds the oldest has waited) — /tasks and /metrics."""
        now = self.clock.monotonic()
        out: dict[str, tuple[int, float]] = {}
        for kind, q in self._queues.items():
            if q:
                out[kind] = (len(q), max(0.0, now - self._queued.get(q[0], now)))
        return out

    def _spawn(self, key: Any, coro: Awaitable[None]) -> None:
        async def wrapped() -> None:
            try:
                await coro
            finally:
                self._running.pop(key, None)
                self._drain()

        task = self._running[key] = asyncio.create_task(wrapped())
        task.add_done_callback(_retrieve)

    async def _run_task(self, key: TaskKey, retry: _Retry) -> None:
        task = retry.task
        try:
            ok = await self._execute(task, retry)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("task %s failed unexpectedly", task)
            ok = False
        finally:
            for u in retry.reserved:  # calls never made (superseded, or an error before)
                self.pacer.release(NodeId(u))
            retry.reserved = {}
        if ok == _LATER:
            # Busy servers, not a failure: soon again, through their (halved) windows, and
            # the tablet's replacement timer waits for the calls to go out again.
            self.catalog.creation_paused(task.tablet_id)
            retry.next_at = self.clock.monotonic() + self.settings.retry_initial_s
            self.wake()
        elif ok:
            self.catalog.task_done(task)
            self._retries.pop(key, None)
        else:
            retry.attempts += 1
            backoff = min(
                self.settings.retry_max_s,
                self.settings.retry_initial_s * 2 ** (retry.attempts - 1),
            )
            retry.next_at = self.clock.monotonic() + backoff
            self.wake()  # recompute the loop's timeout

    # --- executing tasks ---------------------------------------------------------------------

    async def _execute(self, task: Task, retry: _Retry) -> bool | str:
        if failpoints.skipped(type(task).__name__):
            return False  # fault injection: this kind of side effect "keeps failing"
        maps = self.catalog.maps
        tablet = maps.tablets_by_id.get(task.tablet_id)
        table = maps.tables_by_id.get(task.table_id)
        if tablet is None or table is None:
            return True
        record = tablet.record
        if isinstance(task, CreateReplicas):
            if record.state is not TabletState.CREATING or record.consensus is None:
                return True  # superseded: committed state moved on
            self.catalog.create_started(task.tablet_id)  # its assignment timeout runs from now
            todo = [u for u in task.replicas if u not in retry.succeeded]
            outcomes = await asyncio.gather(
                *(self._create_call(task, retry, u, record, table.record) for u in todo)
            )
            failpoints.hit("create_tablet:after_rpc")
            retry.succeeded.update(
                u for u, o in zip(todo, outcomes, strict=True) if o == Outcome.OK
            )
            if all(o == Outcome.OK for o in outcomes):
                return True
            if all(o in (Outcome.OK, Outcome.SHED) for o in outcomes):
                return _LATER
            return False
        if isinstance(task, DeleteReplicas):
            todo = [u for u in task.servers if u not in retry.succeeded]
            results = await asyncio.gather(
                *(
                    self._rpc(
                        u,
                        lambda a, u=u: self.proxy.delete_tablet(
                            a, u, self.fence, task.tablet_id, tombstone=False, reason=task.reason
                        ),
                        ok_errors=(NotFound,),
                        task=task,
                    )
                    for u in todo
                )
            )
            failpoints.hit("delete_tablet:after_rpc")
            retry.succeeded.update(u for u, ok in zip(todo, results, strict=True) if ok)
            return all(results)
        if isinstance(task, AlterReplicas):
            cs = record.consensus
            if record.state is not TabletState.RUNNING or cs is None:
                return True
            targets = [cs.leader_uuid] if cs.leader_uuid else [p.uuid for p in cs.peers]
            schema = table.record.schema
            for u in targets:
                ok = await self._rpc(
                    u,
                    lambda a, u=u: self.proxy.alter_schema(
                        a, u, self.fence, task.tablet_id, schema, table.record.name
                    ),
                )
                if ok:
                    failpoints.hit("alter_schema:after_rpc")
                    return True
            return False
        return True

    async def _create_call(
        self, task: CreateReplicas, retry: _Retry, u: str, record: Any, table: Any
    ) -> str:
        """One CreateTablet of `task` to server `u`, through its window (`CreatePacer`): the
        call's slot was reserved when the task started; the outcome adapts the window and
        tells the assigner of progress."""
        deadline = retry.reserved.pop(u, None)
        if deadline is None:  # not reserved (a server added since): take a slot now
            deadline = self.pacer.start(NodeId(u))
        started = [self.clock.monotonic()]
        self.catalog.creation_call(task.tablet_id, True, started[0] + deadline)

        def on_send() -> None:
            # The latency the window judges is the server's: from when the call left, not
            # from when it began to wait for one of our `max_concurrent_rpcs` slots.
            started[0] = self.clock.monotonic()

        try:
            outcome, sent = await self._rpc_outcome(
                u,
                lambda a: self.proxy.create_tablet(
                    a, u, self.fence, record, table, timeout_s=deadline
                ),
                ok_errors=(AlreadyExists,),
                fallback=_last_known(record.consensus, u),
                task=task,
                on_send=on_send,
            )
        finally:
            self.catalog.creation_call(task.tablet_id, False)
        now = self.clock.monotonic()
        if sent:
            self.pacer.finish(NodeId(u), outcome, now - started[0], now)
        else:
            self.pacer.release(NodeId(u))
        if outcome in (Outcome.OK, Outcome.SHED) and sent:
            self.catalog.creation_progress(task.tablet_id, NodeId(u), outcome == Outcome.OK)
        return outcome

    async def _rpc(
        self,
        server: str,
        call: Any,
        ok_errors: tuple[type[TesseraError], ...] = (),
        fallback: HostPort | None = None,
        task: Task | None = None,
    ) -> bool:
        """One RPC to `server` (skipped, failed, if it is known dead); True on success.
        `fallback`: the address to use if the server never registered here (a peer's last
        known address in a committed config). `task`: the task the RPC belongs to; if
        committed state no longer calls for it once the RPC gets one of the
        `max_concurrent_rpcs` slots (a table deleted while its CreateTablets queued), the RPC
        is not sent and counts as done."""
        outcome, _ = await self._rpc_outcome(server, call, ok_errors, fallback, task)
        return outcome == Outcome.OK

    async def _rpc_outcome(
        self,
        server: str,
        call: Any,
        ok_errors: tuple[type[TesseraError], ...] = (),
        fallback: HostPort | None = None,
        task: Task | None = None,
        on_send: Any = None,
    ) -> tuple[str, bool]:
        """`_rpc`, answering how it ended (`create_pacing.Outcome`) and whether it was sent;
        `on_send` is called as the call leaves (after the wait for a slot)."""
        address = self.ts.rpc_address(server)
        if address is None and fallback is not None:
            address = f"{fallback.host}:{fallback.port}"
        if address is None or (server in self.ts and not self.ts.is_live(server)):
            return Outcome.FAILED, False
        async with self._sem:
            if task is not None and not self.catalog.task_pending(task):
                self.rpcs_skipped += 1
                return Outcome.OK, False
            self.rpcs_sent += 1
            if on_send is not None:
                on_send()
            try:
                await call(address)
                return Outcome.OK, True
            except ok_errors:
                return Outcome.OK, True
            except ResourceExhausted as e:
                self.rpcs_shed += 1
                log.debug("tablet server %s (%s) is busy: %s", server, address, e)
                return Outcome.SHED, True
            except Timeout as e:
                self.rpcs_failed += 1
                log.info("RPC to tablet server %s (%s) timed out: %s", server, address, e)
                return Outcome.TIMEOUT, True
            except TesseraError as e:
                self.rpcs_failed += 1
                log.info("RPC to tablet server %s (%s) failed: %s", server, address, e)
                return Outcome.FAILED, True

    # --- report-driven RPCs ------------------------------------------------------------------

    def submit(self, actions: Iterable[ReportAction]) -> None:
        """Send report-driven RPCs once each (deduplicated while in flight)."""
        for action in actions:
            key = ("report", type(action).__name__, action.tablet_id, _target(action))
            if key in self._running:
                continue
            self._spawn(key, self._send_action(action))

    async def _send_action(self, action: ReportAction) -> None:
        if failpoints.skipped(type(action).__name__):
            return
        if isinstance(action, DeleteReplica):
            if action.tombstone and not await self._tombstone_confirmed(action):
                return
            await self._rpc(
                action.server,
                lambda a: self.proxy.delete_tablet(
                    a,
                    action.server,
                    self.fence,
                    action.tablet_id,
                    tombstone=action.tombstone,
                    cas_config_opid_index=action.cas_config_opid_index,
                    reason=action.reason,
                ),
                ok_errors=(NotFound,),
            )
        elif isinstance(action, AlterReplica):
            table = self.catalog.maps.tables_by_id.get(action.table_id)
            if table is None or table.is_removed:
                return
            schema, name = table.record.schema, table.record.name
            await self._rpc(
                action.server,
                lambda a: self.proxy.alter_schema(
                    a, action.server, self.fence, action.tablet_id, schema, name
                ),
            )
        elif isinstance(action, ChangeReplicaConfig):
            await self._rpc(
                action.leader,
                lambda a: self.proxy.change_config(
                    a,
                    action.leader,
                    self.fence,
                    action.tablet_id,
                    _CHANGE_PB[action.change],
                    action.peer,
                    action.cas_config_opid_index,
                ),
            )

    async def _tombstone_confirmed(self, action: DeleteReplica) -> bool:
        """Nothing is destroyed on one server's word (docs/design/catalog.md#R15): before a
        replica is tombstoned, a majority of the voters of the recorded config that excludes
        it must say, each at the address it registered, that they hold that config committed
        (or a newer one that still excludes it). A config that some server's report alone put
        in the catalog (by a bug, or before this rule) then tombstones nobody. Tombstones are
        rare (an evicted or replaced replica), so one GetConsensusState per voter is cheap."""
        info = self.catalog.maps.tablets_by_id.get(action.tablet_id)
        cs = info.record.consensus if info is not None else None
        if cs is None or cs.peer(action.server) is not None:
            return False  # re-added since the decision: nothing to do
        voters = [p.uuid for p in cs.peers if p.member_type is MemberType.VOTER]

        async def agrees(voter: NodeId) -> bool:
            address = self.ts.rpc_address(voter)
            if address is None:
                return False
            try:
                said = await self.proxy.consensus_states(
                    address, voter, [action.tablet_id], timeout_s=self.proxy.rpc_timeout_s
                )
            except TesseraError as e:
                log.info("tombstone of %s: %s not asked: %s", action.tablet_id, voter, e)
                return False
            got = said.get(action.tablet_id)
            if got is None:
                return False
            c = got.committed
            return same_config(c, cs) or (
                c.config_index > cs.config_index and c.peer(action.server) is None
            )

        votes = await asyncio.gather(*(agrees(v) for v in voters))
        if 2 * sum(votes) > len(voters):
            return True
        self.tombstones_unconfirmed += 1
        log.warning(
            "not tombstoning %s on %s: only %d of its %d recorded voters confirm the config "
            "(op index %d) that excludes it",
            action.tablet_id,
            action.server,
            sum(votes),
            len(voters),
            cs.config_index,
        )
        return False

    # --- re-replication ----------------------------------------------------------------------

    def failed_servers(self) -> set[str]:
        """Servers hosting replicas (per the catalog) dead longer than the eviction time."""
        eviction = self.settings.replica_eviction_s
        return {
            u
            for u in self.ts.silent_for(eviction)
            if not self.ts.is_live(u) and self.ts.replica_counts(u)
        }

    def _rereplicate(self) -> None:
        """A replica is lost when its server has been dead past the eviction time (every
        tablet is looked at) or its server reports it FAILED (only those tablets are)."""
        dead = self.failed_servers()
        reported = self.catalog.failed_replicas
        if not dead and not reported:
            return
        maps = self.catalog.maps
        if dead:
            tablets = list(maps.tablets_by_id.values())
        else:
            tablets = [
                maps.tablets_by_id[t] for t in reported.tablet_ids() if t in maps.tablets_by_id
            ]
        loads = self.ts.server_loads()
        addresses = {
            str(d.uuid): _host_port(d.rpc_address) for d in self.ts.descriptors() if d.live
        }
        changes: list[ReportAction] = []
        cleanups: list[ReportAction] = []
        for tablet in tablets:
            record = tablet.record
            cs = record.consensus
            if record.state is not TabletState.RUNNING or cs is None:
                continue
            failed_here = reported.servers_of(record.tablet_id)
            cleanups.extend(plan_failed_cleanup(record, failed_here))
            lost = dead | failed_here
            if not any(p.uuid in lost for p in cs.peers):
                continue
            table = maps.tables_by_id[record.table_id]
            action = plan_rereplication(
                record, table.record, lost.__contains__, loads, addresses, self.rng
            )
            if action is not None:
                changes.append(action)
        if changes:
            log.info("re-replication: %d config changes", len(changes))
        if cleanups:
            log.info("re-replication: %d replaced FAILED replicas to tombstone", len(cleanups))
        if changes or cleanups:
            self.submit(changes + cleanups)


def _last_known(cs: ConsensusState | None, uuid: str) -> HostPort | None:
    peer = cs.peer(uuid) if cs is not None else None
    return peer.last_known_addr if peer is not None else None


def _targets(task: Task) -> tuple[str, ...]:
    if isinstance(task, CreateReplicas):
        return tuple(task.replicas)
    if isinstance(task, DeleteReplicas):
        return tuple(task.servers)
    return ()  # AlterReplicas: the tablet's leader at the time it runs


def _target(action: ReportAction) -> NodeId:
    return action.leader if isinstance(action, ChangeReplicaConfig) else action.server


def _host_port(address: str) -> HostPort:
    host, _, port = address.rpartition(":")
    return HostPort(host, int(port))


def _retrieve(task: asyncio.Task[None]) -> None:
    """Log how a task of this term ended if it failed: `stop` cancels without waiting, and an
    error nobody retrieves is logged by asyncio as "Task exception was never retrieved", at a
    time and place that no longer say whose it was."""
    if not task.cancelled() and task.exception() is not None:
        log.error("background task %s failed", task.get_name(), exc_info=task.exception())
