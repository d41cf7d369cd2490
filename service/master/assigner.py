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
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable
from collections.abc import Set as AbstractSet
from random import Random

from service.common import failpoints
from service.common.clock import Clock
from service.common.ids import NodeId, TableId, TabletId
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
from service.master.create_pacing import ReplacementRules
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
    tablet t last showed progress in this leader's view (its CreateTablet calls first sent,
    `create_started`; a replica answered, refused as busy, or reported it,
    `creation_progress`), and `_deadline[t]`, when it is due for replacement
    (create_pacing.ReplacementRules), exist only for t in `_creating`, with the same keys;
    `_answered[t]` (servers that answered or reported t), `_calls[t]` (CreateTablet calls
    in flight) and `_paused` (tablets whose remaining calls wait to go out again, with no
    `_creating_since` or `_deadline`) only for t in `_creating`; `_backoff` names only
    tables with PREPARING tablets."""

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
        self._deadline: dict[TabletId, float] = {}
        self._answered: dict[TabletId, set[NodeId]] = {}
        self._calls: dict[TabletId, int] = {}
        self._paused: set[TabletId] = set()
        """CREATING tablets whose remaining calls wait to go out again (`creation_paused`)."""
        """CreateTablet calls in flight per CREATING tablet (`creation_call`)."""
        self.rules = ReplacementRules(
            settings.assignment_timeout_s,
            max_in_flight=settings.max_replacements_in_flight,
            max_in_flight_per_ts=settings.max_replacements_per_ts,
        )
        self.replaced: Counter[str] = Counter()
        """Tablets replaced by this leader, by reason (/metrics)."""
        self.postponed = 0
        """Timed-out tablets whose replacement waited for the budgets (`ReplacementRules`)."""
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
        self._deadline = {t: d for t, d in self._deadline.items() if t in self._creating}
        self._answered = {t: a for t, a in self._answered.items() if t in self._creating}
        self._calls = {t: n for t, n in self._calls.items() if t in self._creating}
        self._paused &= self._creating
        self._backoff.retain(set(maps.preparing))

    def note_committed(self, tablets: Iterable[tuple[TabletRecord | None, TabletRecord]]) -> None:
        """Tablet rows one applied entry committed, (before or None, now): follow CREATING."""
        for _, new in tablets:
            if new.state is TabletState.CREATING:
                self._creating.add(new.tablet_id)
            else:
                self._creating.discard(new.tablet_id)
                self._creating_since.pop(new.tablet_id, None)
                self._deadline.pop(new.tablet_id, None)
                self._answered.pop(new.tablet_id, None)
                self._calls.pop(new.tablet_id, None)
                self._paused.discard(new.tablet_id)

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
        if tablet_id in self._creating and (
            tablet_id not in self._creating_since or tablet_id in self._paused
        ):
            self._paused.discard(tablet_id)
            self._progress(tablet_id, self._clock.monotonic())

    def creation_progress(self, tablet_id: TabletId, server: NodeId, answered: bool) -> None:
        """A sign that CREATING tablet `tablet_id` is being created: `server` answered its
        CreateTablet or reported the tablet (`answered`), or refused it as busy
        (RESOURCE_EXHAUSTED). Its replacement timer starts again (create_pacing)."""
        if tablet_id not in self._creating:
            return
        if answered:
            self._answered.setdefault(tablet_id, set()).add(server)
        self._progress(tablet_id, self._clock.monotonic())

    def creation_call(self, tablet_id: TabletId, started: bool, deadline: float = 0.0) -> None:
        """A CreateTablet call of CREATING `tablet_id` went out (`started`, answered by
        monotonic `deadline` at the latest) or ended. A tablet is never replaced while a call
        to one of its replicas is in flight: the server took it and has not said no, and the
        call's own deadline bounds the wait (create_pacing)."""
        if tablet_id not in self._creating:
            return
        n = self._calls.get(tablet_id, 0) + (1 if started else -1)
        if n > 0:
            self._calls[tablet_id] = n
            if started and tablet_id in self._deadline:
                self._deadline[tablet_id] = max(self._deadline[tablet_id], deadline)
        else:
            self._calls.pop(tablet_id, None)

    def creation_paused(self, tablet_id: TabletId) -> None:
        """The calls of CREATING `tablet_id` that are left were refused as busy: they go out
        again through the servers' windows, and its timer stops until they do (as before its
        first calls: `create_started` starts it again). Waiting for our own pacing is not a
        tablet being stuck."""
        if tablet_id in self._calls or tablet_id not in self._creating:
            return
        self._paused.add(tablet_id)
        self._creating_since.pop(tablet_id, None)
        self._deadline.pop(tablet_id, None)

    def _progress(self, tablet_id: TabletId, now: float) -> None:
        if tablet_id in self._paused:
            return  # a replica's report while the rest wait for our own pacing: no timer
        self._creating_since[tablet_id] = now
        answered = len(self._answered.get(tablet_id, ()))
        self._deadline[tablet_id] = now + self.rules.timeout_for(self._maps, tablet_id, answered)

    def _expired(self, now: float) -> list[TabletId]:
        """CREATING tablets past their deadline, the ones the budgets admit (the others are
        postponed by `ReplacementRules.postpone_s`)."""
        late = [t for t, d in self._deadline.items() if d <= now]
        if not late:
            return []
        for t in [t for t in late if t in self._calls]:  # a call still out: not yet
            self._deadline[t] = now + self.rules.postpone_s
            late.remove(t)
        infos = [self._maps.tablets_by_id[t] for t in late if t in self._maps.tablets_by_id]
        infos.sort(key=lambda i: (i.table_id, i.partition.partition_key_start, i.tablet_id))
        admitted, wait = self.rules.admit(self._maps, infos)
        for info in wait:
            self._deadline[info.tablet_id] = now + self.rules.postpone_s
            self.postponed += 1
        return [i.tablet_id for i in admitted]

    def replace_reason(self, tablet_id: TabletId) -> str:
        """Why a tablet is being replaced, for /metrics: no replica answered, or enough did
        and no leader was reported."""
        info = self._maps.tablets_by_id.get(tablet_id)
        cs = info.record.consensus if info is not None else None
        answered = len(self._answered.get(tablet_id, ()))
        if cs is not None and answered >= len(cs.peers) // 2 + 1:
            return "no leader"
        return "some answered" if answered else "no answer"

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
            expired=[t for t, d in self._deadline.items() if d <= now],
            assignment_timeout_s=self._settings.assignment_timeout_s,
            now_us=self._now_us(),
            new_id=lambda: new_catalog_id(self._rng),
            tables=tables,
        )

    def assignment_due(self, now: float | None = None) -> bool:
        """An assignment round has something to do: PREPARING tablets of tables not waiting
        out a placement backoff and room to make them CREATING (for all of them, or at least
        `_round_quantum`), or a CREATING one past its replacement deadline."""
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
        return min(self._deadline.values(), default=now + 1.0) <= now

    def next_assignment_at(self) -> float | None:
        """When, on the monotonic clock, the earliest backoff or creation timeout runs out
        (None: nothing is waiting); the background loop sleeps no longer than that."""
        times = [self._backoff.earliest()]
        if self._deadline:
            times.append(min(self._deadline.values()))
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
                reasons = [self.replace_reason(r.old) for r in plan.replaced]
                await self._replicate(plan.write)
                self.replaced.update(reasons)
                failpoints.hit("assign_tablets:after_replicate")
        return self._backoff.after_round(plan, self._maps, now)

    def _due(self, now: float, limit: int) -> list[TabletInfo]:
        return due_tablets(
            self._maps,
            expired=self._expired(now),
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
