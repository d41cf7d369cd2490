"""The catalog manager's assigner: when an assignment round is due, and one bounded round.

`catalog_assignment` holds the pure parts (which tablets are due, the planner, the backoff);
`Assigner` is the part with state: which tablets are CREATING and since when their calls went
out, and the backoffs of tables that could not be placed. `CatalogManager` (catalog_manager.py)
holds one and tells it what committed (`reset`, `note_committed`); everything else it needs
comes through its constructor: the tablet servers' loads (`TSManager`), the clock, the rng,
the settings, and the manager's `replicate` and address lookup. It never checks readiness:
the manager answers NotReady before it delegates.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Iterable
from collections.abc import Set as AbstractSet
from random import Random

from service.common import failpoints
from service.common.clock import Clock
from service.common.ids import TableId, TabletId
from service.master.catalog_assignment import (
    AssignmentBackoff,
    AssignmentPlan,
    AssignmentPlanner,
    due_tablets,
    new_catalog_id,
    plan_assignments,
)
from service.master.catalog_info import CatalogMaps, TabletInfo
from service.master.catalog_records import CatalogWrite, HostPort, TabletRecord, TabletState
from service.master.catalog_settings import CatalogSettings
from service.master.sys_catalog import ApplyResult
from service.master.ts_manager import TSManager

__all__ = ["Assigner"]

_PLAN_CHUNK = 32
"""Tablets planned between two yields to the event loop in an assignment round."""


class Assigner:
    """Assignment rounds over the catalog manager's committed maps (module docstring).

    Invariants: `_maps` is the manager's current `CatalogMaps` (it hands over every rebuilt
    one through `reset`); `_creating` holds exactly the CREATING tablets of `_maps` (`reset`
    recomputes it, `note_committed` follows each applied entry); `_creating_since[t]`, when
    this leader first sent tablet t's CreateTablet calls (`create_started`), exists only for
    t in `_creating`; `_backoff` names only tables with PREPARING tablets."""

    def __init__(
        self,
        maps: CatalogMaps,
        ts_manager: TSManager,
        clock: Clock,
        rng: Random,
        settings: CatalogSettings,
        replicate: Callable[[CatalogWrite], Awaitable[ApplyResult]],
        address_of: Callable[[str], HostPort | None],
    ) -> None:
        self._maps = maps
        self._ts = ts_manager
        self._clock = clock
        self._rng = rng
        self._settings = settings
        self._replicate = replicate
        """The manager's: propose one write and wait until it is applied (and so committed in
        the maps, by the manager's listener); a refusal is raised as its error."""
        self._address_of = address_of
        self._creating: set[TabletId] = set()
        self._creating_since: dict[TabletId, float] = {}
        self._backoff = AssignmentBackoff(
            settings.assignment_retry_initial_s, settings.assignment_retry_max_s
        )
        self.reset(maps)

    # --- what committed ----------------------------------------------------------------------

    def reset(self, maps: CatalogMaps) -> None:
        """The manager rebuilt its maps (`maps`): recompute the CREATING tablets; keep when
        the calls of those still CREATING went out, and the backoffs of tables still waiting."""
        self._maps = maps
        self._creating = {
            t for t in maps.pending if maps.tablets_by_id[t].state is TabletState.CREATING
        }
        self._creating_since = {
            t: since for t, since in self._creating_since.items() if t in self._creating
        }
        self._backoff.retain(set(maps.preparing))

    def note_committed(self, tablets: Iterable[tuple[TabletRecord | None, TabletRecord]]) -> None:
        """Tablet rows one applied entry committed, (before or None, now): follow CREATING."""
        for _, new in tablets:
            if new.state is TabletState.CREATING:
                self._creating.add(new.tablet_id)
            else:
                self._creating.discard(new.tablet_id)
                self._creating_since.pop(new.tablet_id, None)

    @property
    def creating(self) -> AbstractSet[TabletId]:
        """The CREATING tablets (read-only: it follows committed state)."""
        return self._creating

    def clear_backoffs(self) -> None:
        """A term starts or ends: a new leader tries every table at once (servers may have
        registered meanwhile)."""
        self._backoff.clear()

    def create_started(self, tablet_id: TabletId) -> None:
        """The background tasks are sending the CreateTablet calls of CREATING tablet
        `tablet_id` for the first time: its assignment timeout starts now (Kudu's
        last_create_tablet_time), not when it entered CREATING, so a tablet whose calls
        waited behind thousands of others is not replaced for the wait."""
        if tablet_id in self._creating:
            self._creating_since.setdefault(tablet_id, self._clock.monotonic())

    # --- rounds ------------------------------------------------------------------------------

    def plan_assignments(
        self, now: float | None = None, tables: Collection[TableId] | None = None
    ) -> AssignmentPlan:
        """One assignment round over committed state as ONE write (`catalog_assignment`);
        `now` is monotonic (default: the clock's); `tables`: only these. Pure but for rng
        draws: nothing changes."""
        now = self._clock.monotonic() if now is None else now
        return plan_assignments(
            self._maps,
            self._ts.server_loads(),
            self._address_of,
            self._rng,
            now=now,
            creating_since=self._creating_since,
            assignment_timeout_s=self._settings.assignment_timeout_s,
            now_us=self._now_us(),
            new_id=lambda: new_catalog_id(self._rng),
            tables=tables,
        )

    def assignment_due(self, now: float | None = None) -> bool:
        """An assignment round has something to do: PREPARING tablets of tables not waiting
        out a placement backoff and room to make them CREATING (for all of them, or at least
        `_round_quantum`), or a CREATING one older than the assignment timeout."""
        if not self._maps.pending:
            return False
        now = self._clock.monotonic() if now is None else now
        tables = self._maps.tables_by_id
        room = self._creating_room()
        if room:
            ready = 0
            for table_id, ids in self._maps.preparing.items():  # tables with PREPARING: few
                table = tables.get(table_id)
                if not (table is None or table.is_removed) and self._backoff.ready(table_id, now):
                    ready += len(ids)
            # Room for all of them, or for a quantum of them (`_round_quantum`).
            if ready and room >= min(ready, self._round_quantum()):
                return True
        oldest = min(self._creating_since.values(), default=now)
        return now - oldest >= self._settings.assignment_timeout_s

    def next_assignment_at(self) -> float | None:
        """When, on the monotonic clock, the earliest backoff or creation timeout runs out
        (None: nothing is waiting); the background loop sleeps no longer than that."""
        times = [self._backoff.earliest()]
        if self._creating_since:
            oldest = min(self._creating_since.values())
            times.append(oldest + self._settings.assignment_timeout_s)
        return min((t for t in times if t is not None), default=None)

    async def assign_tablets(
        self, now: float | None = None, *, max_tablets: int | None = None
    ) -> AssignmentPlan:
        """One bounded assignment round (`catalog_assignment`, "Bounded rounds"): at most
        `max_tablets` (default: the settings') due tablets, locked (tables, then tablets),
        planned in chunks with a yield between them, replicated as ONE write; returns the plan
        (committed when this returns) with the tables it deferred. Replication errors
        propagate and change nothing."""
        now = self._clock.monotonic() if now is None else now
        limit = max_tablets or self._settings.max_tablets_per_assignment_round
        due = self._due(now, limit)
        async with contextlib.AsyncExitStack() as stack:
            for table_id in sorted({t.table_id for t in due}):
                await stack.enter_async_context(self._maps.tables_by_id[table_id].lock.shared())
            for tablet in sorted(due, key=lambda t: t.tablet_id):
                await stack.enter_async_context(tablet.lock)
            # Under the locks: drop what moved on while we waited (the next round sees it).
            again = {t.tablet_id for t in self._due(now, limit)}
            due = [t for t in due if t.tablet_id in again]
            planner = AssignmentPlanner(
                self._maps,
                self._ts.server_loads(),
                self._address_of,
                self._rng,
                assignment_timeout_s=self._settings.assignment_timeout_s,
                now_us=self._now_us(),
                new_id=lambda: new_catalog_id(self._rng),
            )
            for i in range(0, len(due), _PLAN_CHUNK):
                if i:
                    await asyncio.sleep(0)  # let heartbeats in between chunks
                planner.add(due[i : i + _PLAN_CHUNK])
            plan = planner.finish()
            if plan.write is not None:
                await self._replicate(plan.write)
                failpoints.hit("assign_tablets:after_replicate")
        return self._backoff.after_round(plan, self._maps, now)

    def _due(self, now: float, limit: int) -> list[TabletInfo]:
        return due_tablets(
            self._maps,
            now=now,
            creating_since=self._creating_since,
            assignment_timeout_s=self._settings.assignment_timeout_s,
            ready=lambda table_id: self._backoff.ready(table_id, now),
            limit=limit,
            preparing_limit=self._creating_room(),
        )

    def _round_quantum(self) -> int:
        """The least room for new CREATING tablets (or PREPARING tablets ready) worth a round.

        Why. Once `max_creating_tablets` are CREATING, room comes back a tablet or two per
        report; a round as soon as any room appears plans a handful of tablets at the full
        fixed cost of a round (every server's load, a sys.catalog write), so a 10,000-tablet
        table took thousands of rounds and half the master's CPU. Waiting until a quarter of
        a round's worth is free keeps rounds full at no cost in latency that matters: the
        room is there because earlier tablets are already being created."""
        s = self._settings
        return max(1, min(s.max_tablets_per_assignment_round, s.max_creating_tablets) // 4)

    def _creating_room(self) -> int:
        """How many more tablets may enter CREATING now (`catalog_assignment`, "Creation in
        step with capacity")."""
        return max(0, self._settings.max_creating_tablets - len(self._creating))

    def _now_us(self) -> int:
        return int(self._clock.now() * 1_000_000)
