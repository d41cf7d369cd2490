"""Roll-forward from committed state: the assignment step and the side-effect tasks.

Theory of operation
-------------------
Seed 002 makes the replicated entry the commit point: "first do all the computations, then log
it", so that after a crash "the rest of the operation will always be able to complete", by the
new leader working from persisted state. Seed 001 says the same of the master: the background
tasks scan in-memory (committed) state and nudge tablets that are not where their records say
they should be, and that scan continues in a new leader after failover. So nothing here keeps a
queue of promises made by a previous leader: everything is a pure function of committed state.

Two things live here.

1. Tasks: the RPCs to tablet servers that committed state calls for (seed 001's contract, step
   7), as values. `tasks_for(tablet, table)` says, for one tablet record:
     * CREATING: `CreateReplicas` on every peer of its committed config;
     * RUNNING and its leader reported an older schema version than the table's:
       `AlterReplicas` (seed 000's "Alter Table": retried until the report shows the version);
     * DELETED or REPLACED with a config: `DeleteReplicas` on every peer (seed 001 appendix A,
       case 2: persistent state says the replica was deleted, a decision that cannot become
       wrong, so it needs no fencing).
   The catalog manager keeps the tasks of every tablet up to date as writes commit, and a new
   leader recomputes them all when it loads the catalog.

2. The assignment step (seed 000, "Table Assignment"; seed 001 appendix B "Background task
   scanning", with its fixes). `plan_assignments` looks at committed state only and returns
   ONE `CatalogWrite` (or none) that
     * moves every PREPARING tablet it can place to CREATING with its chosen committed config
       (placement_policy: fewest replicas of the table, then fewest in total, among live
       servers; `place_table` per table so one round spreads a table evenly);
     * marks every CREATING tablet whose creation has not been reported within the assignment
       timeout REPLACED, and inserts in the same write a new PREPARING tablet for the same
       partition (`replaces` / `replaced_by` link them). The new tablet is not visible to
       anyone, locations included, until that write commits (seed 001's fix of the third
       audit exception); it is assigned by the next round.
   Each updated row carries a precondition on the version it was read at, so a plan made from
   stale state (a deposed leader) is refused at apply rather than applied.

   As Kudu 1.x does, no initial leader is chosen: the replicas elect one (pre-vote), and the
   elected leader's report makes the tablet RUNNING (report processing, later work). The
   committed config's op index is 0 (the initial config) and its term 0.

The creation timer is soft state: each master notes when it saw a tablet enter CREATING (a
follower too, when it applied the entry; a master that loaded the tablet from a snapshot or at
start, when it loaded). Either way the timer starts no earlier than the entry committed, so a
tablet is never replaced early, only possibly late after a failover, as in Kudu.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from random import Random
from typing import TypeAlias

from service.common.errors import FailedPrecondition
from service.common.ids import NodeId, TableId, TabletId
from service.master.catalog_info import CatalogMaps, TabletInfo
from service.master.catalog_records import (
    CatalogWrite,
    ConsensusState,
    EntryType,
    HostPort,
    Insert,
    MemberType,
    Precondition,
    RaftPeer,
    RowKey,
    RowOp,
    TableRecord,
    TabletRecord,
    TabletState,
    Update,
)
from service.master.placement_policy import ServerLoad, place_table

__all__ = [
    "ASSIGN_OPERATION",
    "AlterReplicas",
    "AssignmentPlan",
    "CreateReplicas",
    "DeleteReplicas",
    "PendingTasks",
    "Replacement",
    "Task",
    "Unplaced",
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

    def update(self, tablet: TabletRecord, table: TableRecord | None) -> None:
        """Recompute one tablet's tasks from its committed record (and its table's)."""
        fresh = {task_key(t): t for t in tasks_for(tablet, table)}
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


@dataclass(frozen=True)
class AssignmentPlan:
    """One assignment round: ONE write (None when there is nothing to do) and what it does."""

    write: CatalogWrite | None
    assigned: tuple[TabletId, ...] = ()
    """PREPARING -> CREATING."""
    replaced: tuple[Replacement, ...] = ()
    """CREATING -> REPLACED, each with its new PREPARING tablet."""
    unplaced: tuple[Unplaced, ...] = ()

    @property
    def empty(self) -> bool:
        return self.write is None


def _key(tablet_id: str) -> RowKey:
    return RowKey(EntryType.TABLET, tablet_id)


def plan_assignments(
    maps: CatalogMaps,
    servers: Sequence[ServerLoad],
    addresses: Mapping[str, HostPort],
    rng: Random,
    *,
    now: float,
    creating_since: Mapping[TabletId, float],
    assignment_timeout_s: float,
    now_us: int,
    new_id: Callable[[], str],
    tables: Collection[TableId] | None = None,
) -> AssignmentPlan:
    """One assignment round over committed state (module docstring). Pure but for `rng` draws
    and `new_id` calls.

    `servers`: every tablet server as placement sees it (`TSManager.server_loads()`);
    `addresses`: their rpc addresses, recorded as each peer's last known address;
    `now`: monotonic, compared with `creating_since` (when each CREATING tablet was seen to
    enter CREATING); `now_us`: wall time for new records; `tables`: only tablets of these
    tables (the ones whose locks the caller holds); None: all.
    """
    ops: list[RowOp] = []
    expected: list[Precondition] = []
    replaced: list[Replacement] = []
    preparing: dict[TableId, list[TabletInfo]] = {}
    for info in maps.pending_tablets():
        table = maps.tables_by_id.get(info.table_id)
        if table is None or table.is_removed:
            continue  # DeleteTable marks them DELETED in its own write
        if tables is not None and info.table_id not in tables:
            continue
        record = info.record
        if record.state is TabletState.PREPARING:
            preparing.setdefault(info.table_id, []).append(info)
            continue
        since = creating_since.get(info.tablet_id, now)
        if now - since < assignment_timeout_s:
            continue
        new = TabletId(new_id())
        ops.append(
            Update(
                replace(
                    record,
                    state=TabletState.REPLACED,
                    replaced_by=new,
                    state_msg=(
                        f"not reported created within {assignment_timeout_s:g}s; "
                        f"replaced by tablet {new}"
                    ),
                )
            )
        )
        expected.append(Precondition(_key(info.tablet_id), info.version))
        ops.append(
            Insert(
                TabletRecord(
                    tablet_id=new,
                    table_id=record.table_id,
                    partition=record.partition,
                    state=TabletState.PREPARING,
                    replaces=record.tablet_id,
                    created_time_us=now_us,
                )
            )
        )
        expected.append(Precondition.absent(_key(new)))
        replaced.append(Replacement(info.tablet_id, new))

    # Working loads: each table's placement counts the replicas chosen for earlier tables.
    totals = {s.uuid: s.total_replicas for s in servers}
    by_table = {s.uuid: dict(s.replicas_by_table) for s in servers}
    assigned: list[TabletId] = []
    unplaced: list[Unplaced] = []
    for table_id in sorted(preparing):
        infos = preparing[table_id]
        table_record = maps.tables_by_id[table_id].record
        loads = [
            ServerLoad(s.uuid, s.live, totals[s.uuid], by_table[s.uuid], s.location)
            for s in servers
        ]
        try:
            chosen = place_table(loads, table_id, len(infos), table_record.num_replicas, rng)
        except FailedPrecondition as e:
            msg = f"table {table_record.name!r} ({table_id}): {e.message}"
            unplaced.extend(Unplaced(i.tablet_id, msg) for i in infos)
            continue
        for info, replicas in zip(infos, chosen, strict=True):
            peers = tuple(RaftPeer(NodeId(u), MemberType.VOTER, addresses.get(u)) for u in replicas)
            consensus = ConsensusState(term=0, config_index=0, peers=peers)
            ops.append(
                Update(replace(info.record, state=TabletState.CREATING, consensus=consensus))
            )
            expected.append(Precondition(_key(info.tablet_id), info.version))
            assigned.append(info.tablet_id)
            for u in replicas:
                totals[u] += 1
                by_table[u][table_id] = by_table[u].get(table_id, 0) + 1
    if not ops:
        return AssignmentPlan(None, unplaced=tuple(unplaced))
    write = CatalogWrite(ops=tuple(ops), expected=tuple(expected), operation=ASSIGN_OPERATION)
    return AssignmentPlan(write, tuple(assigned), tuple(replaced), tuple(unplaced))
