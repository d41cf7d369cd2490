"""Roll-forward from committed state: the assignment step and the side-effect tasks.

Theory of operation
-------------------
The replicated entry is the commit point (docs/design/coordinator.md#R1): every decision is made
before it is logged, so that after a crash a new leader can complete the operation from persisted
state alone (docs/design/coordinator.md#R2). The background tasks scan in-memory (committed) state
and nudge tablets that are not where their records say they should be, and that scan continues in a
new leader after failover (docs/design/coordinator.md#R3). So nothing here keeps a queue of promises
made by a previous leader: everything is a pure function of committed state.

Two things live here.

1. Tasks: the RPCs to tablet servers that committed state calls for (docs/design/catalog.md#R7),
   as values. `tasks_for(tablet, table)` says, for one tablet record:
     * CREATING: `CreateReplicas` on every peer of its committed config;
     * RUNNING and its leader reported an older schema version than the table's:
       `AlterReplicas` (retried until the report shows the version, docs/design/catalog.md#R14);
     * DELETED or REPLACED with a config: `DeleteReplicas` on every peer (persistent state says the
       replica was deleted, a decision that cannot become wrong, so it needs no fencing).
   The catalog manager keeps the tasks of every tablet up to date as writes commit, and a new
   leader recomputes them all when it loads the catalog.

2. The assignment step (docs/design/catalog.md#R12, #R13). `plan_assignments` looks at committed
   state only and returns ONE `CatalogWrite` (or none) per round that
     * moves the PREPARING tablets it can place to CREATING with their chosen committed
       configs (placement_policy: fewest replicas of the table, then fewest in total, among
       live servers; one `TablePlacer` per table so a round spreads a table evenly);
     * marks every CREATING tablet past its replacement deadline (no progress for its timeout,
       within the budgets: create_pacing, docs/design/catalog.md#R16) REPLACED, and inserts
       in the same write a new PREPARING tablet for the same partition (`replaces` /
       `replaced_by` link them). The new tablet is not visible to
       anyone, locations included, until that write commits (docs/design/catalog.md#R3); it is
       assigned by the next round.
   Each updated row carries a precondition on the version it was read at, so a plan made from
   stale state (a deposed leader) is refused at apply rather than applied.

   Bounded rounds. A round handles at most `max_tablets_per_assignment_round` due tablets
   (`due_tablets`, in table then partition order); the background tasks run the next round
   at once while more are due. The round is planned in chunks (`AssignmentPlanner.add`) with
   a yield to the event loop between them, so one round holds the loop for a few
   milliseconds at a time and heartbeats are read throughout: a 10,000-tablet CreateTable
   (still ONE entry, docs/design/catalog.md#R4) is assigned in fifty rounds instead of one
   multi-second one whose stall made the master declare its tablet servers dead.

   Creation in step with capacity. At most `max_creating_tablets` tablets are CREATING at
   once; PREPARING ones wait for room, so replicas are chosen with fresh loads, not long
   before their CreateTablet calls go out. And a tablet's assignment timeout runs from when
   its calls were first sent (`CatalogManager.create_started`, Kudu's
   last_create_tablet_time), not from when it entered CREATING: measured from CREATING, a
   10,000-tablet table timed out while most of its calls still queued, and the replacements'
   churn (thousands of deletes and new creates) overwhelmed the master.

   Backoff. A table whose tablets cannot be placed (too few live servers) is not tried again
   every round: `AssignmentBackoff` doubles its pause from `assignment_retry_initial_s` up to
   `assignment_retry_max_s`, and each failed attempt yields one `Deferred`, logged once with
   the count of tablets waiting, instead of a warning every round.

   As Kudu 1.x does, no initial leader is chosen: the replicas elect one (pre-vote), and the
   elected leader's report makes the tablet RUNNING (report processing, later work). The
   committed config's op index is 0 (the initial config) and its term 0.

The creation timer is soft state of the leader: it starts when this leader's background tasks
first send the tablet's CreateTablet calls (a new leader starts it again for the tablets it
finds CREATING). It starts no earlier than the entry committed, so a tablet is never replaced
early, only possibly late after a failover, as in Kudu.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from random import Random
from types import MappingProxyType
from typing import TypeAlias

from service.common.errors import FailedPrecondition
from service.common.ids import NodeId, TableId, TabletId
from service.master.catalog_info import CatalogMaps, TabletInfo
from service.master.catalog_records import (
    CatalogWrite,
    ConsensusState,
    HostPort,
    Insert,
    MemberType,
    Precondition,
    RaftPeer,
    RecordType,
    RowKey,
    RowOp,
    TableRecord,
    TabletRecord,
    TabletState,
    Update,
)
from service.master.placement_policy import ServerLoad, TablePlacer

__all__ = [
    "ASSIGN_OPERATION",
    "AlterReplicas",
    "AssignmentBackoff",
    "AssignmentPlan",
    "AssignmentPlanner",
    "CreateReplicas",
    "Deferred",
    "DeleteReplicas",
    "PendingTasks",
    "Replacement",
    "Task",
    "Unplaced",
    "due_tablets",
    "new_catalog_id",
    "plan_assignments",
    "task_key",
    "tasks_for",
]

ASSIGN_OPERATION = "AssignTablets"


def new_catalog_id(rng: Random) -> str:
    """A fresh table or tablet id: a version-4 uuid drawn from `rng`, as 32 hex digits."""
    return uuid.UUID(int=rng.getrandbits(128), version=4).hex


# --- tasks -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateReplicas:
    """Send CreateTablet for `tablet_id` to every server in `replicas` (its committed config)."""

    tablet_id: TabletId
    table_id: TableId
    replicas: tuple[NodeId, ...]
    config_index: int


@dataclass(frozen=True, slots=True)
class DeleteReplicas:
    """Send DeleteTablet for `tablet_id` to every server in `servers`."""

    tablet_id: TabletId
    table_id: TableId
    servers: tuple[NodeId, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class AlterReplicas:
    """Send AlterSchema (to `schema_version`) to the tablet's leader replica."""

    tablet_id: TabletId
    table_id: TableId
    schema_version: int


Task: TypeAlias = CreateReplicas | DeleteReplicas | AlterReplicas
TaskKey: TypeAlias = tuple[str, TabletId]


def task_key(task: Task) -> TaskKey:
    """A tablet has at most one task of each kind."""
    return (type(task).__name__, task.tablet_id)


def tasks_for(tablet: TabletRecord, table: TableRecord | None) -> tuple[Task, ...]:
    """The side effects committed state calls for on one tablet (module docstring)."""
    cs = tablet.consensus
    if tablet.state is TabletState.CREATING and cs is not None:
        peers = tuple(p.uuid for p in cs.peers)
        return (CreateReplicas(tablet.tablet_id, tablet.table_id, peers, cs.config_index),)
    if tablet.state is TabletState.RUNNING:
        if (
            table is not None
            and not table.is_removed
            and tablet.reported_schema_version < table.schema_version
        ):
            return (AlterReplicas(tablet.tablet_id, tablet.table_id, table.schema_version),)
        return ()
    if tablet.state.is_terminal and cs is not None:
        if tablet.state is TabletState.REPLACED:
            reason = f"replaced by tablet {tablet.replaced_by}"
        else:
            reason = tablet.state_msg or "table deleted"
        peers = tuple(p.uuid for p in cs.peers)
        return (DeleteReplicas(tablet.tablet_id, tablet.table_id, peers, reason),)
    return ()


class PendingTasks:
    """The tasks committed state calls for, kept per tablet, minus those reported done.

    Invariants: `_tasks[task_key(t)] == t`; every task in `_done` is in `_tasks` (a task
    that committed state no longer calls for, or calls for with other values, is forgotten
    with its done mark).
    """

    _KINDS = ("CreateReplicas", "DeleteReplicas", "AlterReplicas")

    def __init__(self) -> None:
        self._tasks: dict[TaskKey, Task] = {}
        self._done: set[Task] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def clear(self) -> None:
        self._tasks.clear()
        self._done.clear()

    def forget_done(self) -> None:
        """Every task pending again (a new leader cannot know what the last one sent)."""
        self._done.clear()

    def update(self, tablet: TabletRecord, table: TableRecord | None) -> bool:
        """Recompute one tablet's tasks from its committed record (and its table's); True if
        a task was added or changed (work for the background tasks; a removal is not)."""
        fresh = {task_key(t): t for t in tasks_for(tablet, table)}
        added = False
        for kind in self._KINDS:
            key = (kind, tablet.tablet_id)
            old, new = self._tasks.get(key), fresh.get(key)
            if old == new:
                continue
            if old is not None:
                self._done.discard(old)
                del self._tasks[key]
            if new is not None:
                self._tasks[key] = new
                added = True
        return added

    def is_pending(self, task: Task) -> bool:
        """Committed state still calls for exactly `task` and it was not reported done."""
        return self._tasks.get(task_key(task)) == task and task not in self._done

    def pending(self) -> list[Task]:
        """Tasks not reported done, in the order committed state first called for them."""
        return [t for t in self._tasks.values() if t not in self._done]

    def done(self, task: Task) -> None:
        """`task` was carried out: not listed again unless committed state calls for it anew."""
        if self._tasks.get(task_key(task)) == task:
            self._done.add(task)


# --- the assignment step ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Replacement:
    old: TabletId
    new: TabletId


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A PREPARING tablet left as it is this round, and why (e.g. too few live servers)."""

    tablet_id: TabletId
    reason: str


@dataclass(frozen=True, slots=True)
class Deferred:
    """A table whose tablets could not be placed this round and now wait out a backoff: the
    one warning to log for this backoff step (module docstring, "Bounded rounds")."""

    table_id: TableId
    tablets: int
    """PREPARING tablets of the table now waiting (not only this round's)."""
    reason: str
    attempts: int
    retry_in_s: float


@dataclass(frozen=True)
class AssignmentPlan:
    """One assignment round: ONE write (None when there is nothing to do) and what it does."""

    write: CatalogWrite | None
    assigned: tuple[TabletId, ...] = ()
    """PREPARING -> CREATING."""
    replaced: tuple[Replacement, ...] = ()
    """CREATING -> REPLACED, each with its new PREPARING tablet."""
    unplaced: tuple[Unplaced, ...] = ()
    deferred: tuple[Deferred, ...] = ()
    """Filled in by the catalog manager once the round is over (`AssignmentBackoff`)."""

    @property
    def empty(self) -> bool:
        return self.write is None


def _key(tablet_id: str) -> RowKey:
    return RowKey(RecordType.TABLET, tablet_id)


def due_tablets(
    maps: CatalogMaps,
    *,
    expired: Collection[TabletId],
    ready: Callable[[TableId], bool] = lambda _: True,
    tables: Collection[TableId] | None = None,
    limit: int | None = None,
    preparing_limit: int | None = None,
) -> list[TabletInfo]:
    """The pending tablets an assignment round handles, at most `limit`: first the CREATING
    ones of `expired` (past their replacement deadline and admitted by the budgets,
    create_pacing.ReplacementRules; by table, then partition), then at most
    `preparing_limit` PREPARING tablets of tables that are `ready` (not waiting out a
    placement backoff), by table, then partition. Tablets of removed tables are left to
    DeleteTable; `tables`: only these (None: all). Reads the maps' PREPARING index
    (`CatalogMaps.preparing`), never every pending tablet, so bounded rounds over a huge
    table do not cost a full pass each."""

    def wanted(table_id: TableId) -> bool:
        table = maps.tables_by_id.get(table_id)
        if table is None or table.is_removed:
            return False  # DeleteTable marks them DELETED in its own write
        return tables is None or table_id in tables

    out: list[TabletInfo] = []
    timed_out = []
    for tablet_id in expired:
        info = maps.tablets_by_id.get(tablet_id)
        if info is not None and info.state is TabletState.CREATING and wanted(info.table_id):
            timed_out.append(info)
    timed_out.sort(key=lambda t: (t.table_id, t.partition.partition_key_start, t.tablet_id))
    out.extend(timed_out[:limit])
    cap = len(out) + preparing_limit if preparing_limit is not None else None
    if limit is not None:
        cap = limit if cap is None else min(cap, limit)
    for table_id in sorted(maps.preparing):
        if cap is not None and len(out) >= cap:
            break
        if not wanted(table_id) or not ready(table_id):
            continue
        for info in maps.preparing_tablets(table_id):
            out.append(info)
            if cap is not None and len(out) >= cap:
                break
    return out


class AssignmentPlanner:
    """Builds ONE assignment write from due tablets handed over in chunks (`add`), so the
    caller can yield to the event loop between chunks; `finish` returns the plan.

    Each table is placed by one `TablePlacer` across chunks, and the working loads count the
    replicas chosen for earlier tables, so chunking changes neither choices nor rng draws.
    Pure but for `rng` draws and `new_id` calls.

    Invariants: `_ops[i]` goes with `_expected[i]`; `_totals`/`_by_table` are the servers'
    loads plus every replica chosen so far; `_failed[t]` is why table t could not be placed
    (its later tablets are unplaced without another attempt).
    """

    def __init__(
        self,
        maps: CatalogMaps,
        servers: Sequence[ServerLoad],
        address_of: Callable[[str], HostPort | None],
        rng: Random,
        *,
        assignment_timeout_s: float,
        now_us: int,
        new_id: Callable[[], str],
    ) -> None:
        self._maps = maps
        self._servers = servers
        self._address_of = address_of
        self._rng = rng
        self._timeout_s = assignment_timeout_s
        self._now_us = now_us
        self._new_id = new_id
        self._totals = {s.uuid: s.total_replicas for s in servers}
        self._by_table = {s.uuid: dict(s.replicas_by_table) for s in servers}
        self._placer: TablePlacer | None = None
        self._failed: dict[TableId, str] = {}
        self._ops: list[RowOp] = []
        self._expected: list[Precondition] = []
        self._assigned: list[TabletId] = []
        self._replaced: list[Replacement] = []
        self._unplaced: list[Unplaced] = []

    def add(self, infos: Sequence[TabletInfo]) -> None:
        """Plan these due tablets (`due_tablets` order): replace the CREATING ones, place the
        PREPARING ones."""
        preparing: list[TabletInfo] = []
        for info in infos:
            if info.record.state is TabletState.PREPARING:
                preparing.append(info)
            else:
                self._replace(info)
        start = 0
        while start < len(preparing):  # runs of one table
            table_id = preparing[start].table_id
            end = start
            while end < len(preparing) and preparing[end].table_id == table_id:
                end += 1
            self._place(table_id, preparing[start:end])
            start = end

    def finish(self) -> AssignmentPlan:
        unplaced = tuple(self._unplaced)
        if not self._ops:
            return AssignmentPlan(None, unplaced=unplaced)
        write = CatalogWrite(
            ops=tuple(self._ops), expected=tuple(self._expected), operation=ASSIGN_OPERATION
        )
        return AssignmentPlan(write, tuple(self._assigned), tuple(self._replaced), unplaced)

    def _replace(self, info: TabletInfo) -> None:
        record = info.record
        new = TabletId(self._new_id())
        timeout = self._timeout_s
        msg = (
            f"no progress in its creation for {timeout:g}s or longer (no replica answered, "
            f"or no leader was reported); replaced by tablet {new}"
        )
        self._ops.append(
            Update(replace(record, state=TabletState.REPLACED, replaced_by=new, state_msg=msg))
        )
        self._expected.append(Precondition(_key(info.tablet_id), info.version))
        self._ops.append(
            Insert(
                TabletRecord(
                    tablet_id=new,
                    table_id=record.table_id,
                    partition=record.partition,
                    state=TabletState.PREPARING,
                    replaces=record.tablet_id,
                    created_time_us=self._now_us,
                )
            )
        )
        self._expected.append(Precondition.absent(_key(new)))
        self._replaced.append(Replacement(info.tablet_id, new))

    def _place(self, table_id: TableId, infos: Sequence[TabletInfo]) -> None:
        table_record = self._maps.tables_by_id[table_id].record
        if table_id not in self._failed and (
            self._placer is None or self._placer.table_id != table_id
        ):
            # Unchecked: the counts are the servers' (checked) loads plus the replicas chosen
            # so far; TablePlacer copies what it needs before the planner changes them again.
            loads = [
                ServerLoad.unchecked(
                    s.uuid,
                    s.live,
                    self._totals[s.uuid],
                    MappingProxyType(self._by_table[s.uuid]),
                    s.location,
                )
                for s in self._servers
            ]
            try:
                self._placer = TablePlacer(loads, table_id, table_record.num_replicas)
            except FailedPrecondition as e:
                self._placer = None
                self._failed[table_id] = f"table {table_record.name!r} ({table_id}): {e.message}"
        if table_id in self._failed or self._placer is None:
            self._unplaced.extend(Unplaced(i.tablet_id, self._failed[table_id]) for i in infos)
            return
        chosen = self._placer.place(len(infos), self._rng)
        for info, replicas in zip(infos, chosen, strict=True):
            peers = tuple(
                RaftPeer(NodeId(u), MemberType.VOTER, self._address_of(u)) for u in replicas
            )
            consensus = ConsensusState(term=0, config_index=0, peers=peers)
            self._ops.append(
                Update(replace(info.record, state=TabletState.CREATING, consensus=consensus))
            )
            self._expected.append(Precondition(_key(info.tablet_id), info.version))
            self._assigned.append(info.tablet_id)
            for u in replicas:
                self._totals[u] += 1
                by_table = self._by_table[u]
                by_table[table_id] = by_table.get(table_id, 0) + 1


def plan_assignments(
    maps: CatalogMaps,
    servers: Sequence[ServerLoad],
    address_of: Callable[[str], HostPort | None],
    rng: Random,
    *,
    now: float,
    expired: Collection[TabletId],
    assignment_timeout_s: float,
    now_us: int,
    new_id: Callable[[], str],
    tables: Collection[TableId] | None = None,
    limit: int | None = None,
) -> AssignmentPlan:
    """One assignment round over committed state in one go (module docstring): `due_tablets`
    then an `AssignmentPlanner` over all of them. Pure but for `rng` draws and `new_id` calls.

    `servers`: every tablet server as placement sees it (`TSManager.server_loads()`);
    `address_of`: a server's rpc address, recorded as each peer's last known address;
    `now`: monotonic; `expired`: the CREATING tablets to replace (past their deadline);
    `now_us`: wall time for new records; `tables`: only tablets of these
    tables (the ones whose locks the caller holds); None: all; `limit`: at most this many.
    """
    del now  # the caller judged the deadlines (`expired`)
    due = due_tablets(
        maps,
        expired=expired,
        tables=tables,
        limit=limit,
    )
    planner = AssignmentPlanner(
        maps,
        servers,
        address_of,
        rng,
        assignment_timeout_s=assignment_timeout_s,
        now_us=now_us,
        new_id=new_id,
    )
    planner.add(due)
    return planner.finish()


# --- backoff of unplaceable tables -----------------------------------------------------------


@dataclass(slots=True)
class _Step:
    attempts: int
    next_at: float


class AssignmentBackoff:
    """When each table's unplaced PREPARING tablets may be tried again (soft state of one
    leader: a new leader tries everything at once). Times are the caller's monotonic clock.

    Invariants: every entry has attempts >= 1; its pause was
    min(max_s, initial_s * 2 ** (attempts - 1)).
    """

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self._steps: dict[TableId, _Step] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def ready(self, table_id: TableId, now: float) -> bool:
        step = self._steps.get(table_id)
        return step is None or now >= step.next_at

    def failed(self, table_id: TableId, now: float) -> _Step:
        """One more failed attempt: the next one waits twice as long, up to `max_s`."""
        step = self._steps.get(table_id)
        attempts = 1 if step is None else step.attempts + 1
        pause = min(self.max_s, self.initial_s * 2 ** min(attempts - 1, 62))
        self._steps[table_id] = new = _Step(attempts, now + pause)
        return new

    def succeeded(self, table_id: TableId) -> None:
        self._steps.pop(table_id, None)

    def after_round(self, plan: AssignmentPlan, maps: CatalogMaps, now: float) -> AssignmentPlan:
        """Record a round's outcome: a table with a tablet placed starts afresh, a table with
        unplaced tablets waits one more backoff step. Returns `plan` with one `Deferred` per
        table that failed (its PREPARING tablets counted from `maps`, committed state)."""
        tablets = maps.tablets_by_id
        for tablet_id in plan.assigned:
            info = tablets.get(tablet_id)
            if info is not None:
                self.succeeded(info.table_id)
        reasons: dict[TableId, str] = {}
        for u in plan.unplaced:
            info = tablets.get(u.tablet_id)
            if info is not None:
                reasons.setdefault(info.table_id, u.reason)
        if not reasons:
            return plan
        waiting = {t: len(maps.preparing.get(t, ())) for t in reasons}
        deferred = []
        for table_id in sorted(reasons):
            step = self.failed(table_id, now)
            deferred.append(
                Deferred(
                    table_id=table_id,
                    tablets=waiting[table_id],
                    reason=reasons[table_id],
                    attempts=step.attempts,
                    retry_in_s=step.next_at - now,
                )
            )
        return replace(plan, deferred=tuple(deferred))

    def next_at(self, table_id: TableId) -> float | None:
        step = self._steps.get(table_id)
        return None if step is None else step.next_at

    def earliest(self) -> float | None:
        """When the next table becomes ready again (None: none is waiting)."""
        return min((s.next_at for s in self._steps.values()), default=None)

    def retain(self, table_ids: Collection[TableId]) -> None:
        """Forget tables no longer waiting (placed, deleted, or replaced by other tablets)."""
        for t in [t for t in self._steps if t not in table_ids]:
            del self._steps[t]

    def clear(self) -> None:
        self._steps.clear()
