"""TSManager: the master's registry of tablet servers, fed by heartbeats, on every master.

Theory of operation
-------------------
The registry (docs/design/failover.md#R2) maps each tablet server's permanent uuid to
what the master knows of it. A heartbeat is handled in this order (`heartbeat()`):

1. With a registration: register the instance (a new uuid gets a record; a known uuid with an
   equal instance seqno is a retry, a higher one a restart; a lower one is a former process and
   is refused with `FailedPrecondition`).
2. Without: look the instance up. An unknown uuid, or a seqno other than the registered one, is
   answered "needs re-register" (and "needs a full report"), and nothing else happens: liveness
   is only ever recorded for a registered process.
3. Record the heartbeat time (the injected `Clock`'s monotonic time).
4. Say whether a full tablet report is due; the caller processes any report it carries and, for
   a full one, returns the `ReportToken` through `full_report_processed()`.

Liveness is derived, never stored: a server is live while its last heartbeat is less than
`unresponsive_timeout_s` old. Nothing sweeps the registry and nothing is ever removed, so a
silent server is "dead", not forgotten; a heartbeat from it revives it (counted in
`revivals`: a healthy fleet keeps it at zero, so a growing count means flapping servers or a
master too slow to read their heartbeats). Ages are measured on the injected clock; the master
injects a `ProgressClock`, which stands still while the master's own event loop is stalled, so
a server is never declared dead because the master was too busy to read its heartbeats
(`progress_clock` explains why that, and not a re-check after catching up).

Multi-master (docs/design/failover.md#R1, which ends KUDU-1358). In Kudu's first design only the
leader master accepted heartbeats, so a newly elected leader started with an empty registry: every
server was unknown until it heard a "needs re-register" and came back, and meanwhile CreateTable
failed for want of live servers and under-replication looked universal. Here tablet servers
heartbeat to ALL masters and this class behaves identically on followers and on the leader: a
follower records registrations and liveness (its heartbeat handler skips report processing and
does not ask for reports). So the registry is warm the moment a follower wins an election, and
the election changes exactly one thing: the new leader calls `request_full_reports()`, because
reports sent while it was a follower were not processed by it (KUDU-1374). Replica locations
themselves live in the catalog's tablet records, not here (KUDU-1353); the catalog pushes the
per-server replica counts placement needs (`set_replica_counts`/`replace_replica_counts`).

A master that has just started has heard from nobody: for one heartbeat interval its registry
is cold. An unknown uuid is "not heard from", not dead; `presumed_dead()` only calls a server
that never registered dead once this manager has existed for a whole unresponsive timeout, so
re-replication right after a restart does not evict healthy replicas.

Full reports and tokens. `full_report_pending` is set at every registration (the master knows
nothing reliable about a freshly started process) and by `request_full_reports()`. Processing a
report replicates to sys.catalog, which awaits; a re-election or a server restart may happen in
between. Each request bumps a sequence number, the heartbeat hands out a token naming it, and
only a token for the latest request clears the flag, so a report begun under an old request
never satisfies a newer one.

Ownership and thread-safety: one asyncio event loop owns a TSManager (docs/design/layers.md#R5). No
method awaits or blocks, so each call is atomic with respect to the loop's other tasks; no lock is
needed or taken. Do not call it from another thread (a Spark executor, a `to_thread` worker): hand
such code `TSDescriptor`/`ServerLoad` snapshots, which are immutable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from service.common.clock import Clock
from service.common.config import MasterConfig
from service.common.errors import InvalidArgument
from service.common.ids import NodeId
from service.master.placement_policy import ServerLoad
from service.master.ts_descriptor import (
    NodeInstance,
    ReportToken,
    TSDescriptor,
    TSRecord,
    TSRegistration,
)

__all__ = ["HeartbeatOutcome", "TSManager"]

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    """What the heartbeat handler needs to answer one heartbeat."""

    needs_reregister: bool
    """The instance is not registered here: reply "needs re-register" and stop
    (docs/design/failover.md#R2)."""
    needs_full_report: bool
    """A full tablet report is due from this server (the leader asks for it in its reply)."""
    descriptor: TSDescriptor | None = None
    """The server after this heartbeat; None when it must re-register."""
    report_token: ReportToken | None = None
    """Pass to `full_report_processed` after processing a full report carried by this
    heartbeat; None when it must re-register."""
    restarted: bool = False
    """The heartbeat registered a new process of a known server (a higher instance seqno)."""


MAX_SEQNO_AHEAD_S = 3600
"""How far ahead of a master's wall clock a registering server's instance seqno (its start
time) may be: clocks differ by far less, and a seqno beyond it would lock the server's later
processes out (`TSManager._register`)."""


class TSManager:
    """The registry of tablet servers, keyed by permanent uuid (see the module docstring).

    Invariants: `_records[u].uuid == u`; records are never removed; `_counts` holds only
    positive counts and may name uuids without a record (the catalog can know replicas on a
    server this master has not heard from yet; they show up once it registers).
    """

    def __init__(self, clock: Clock, unresponsive_timeout_s: float) -> None:
        if not unresponsive_timeout_s > 0:
            raise InvalidArgument(
                f"unresponsive_timeout_s must be > 0, got {unresponsive_timeout_s}"
            )
        self._clock = clock
        self._timeout = float(unresponsive_timeout_s)
        self._created = clock.monotonic()
        self._records: dict[NodeId, TSRecord] = {}
        self._counts: dict[str, dict[str, int]] = {}
        self.heartbeats_received = 0
        """Heartbeats handled since this manager was created (for /metrics)."""
        self.revivals = 0
        """Heartbeats from a registered server that was dead at the time (for /metrics)."""
        self.addresses_version = 0
        """Bumped whenever `rpc_address` may answer differently: a server registers for the
        first time or at another address (the table locations cache checks it)."""

    @classmethod
    def from_config(cls, config: MasterConfig, clock: Clock) -> TSManager:
        return cls(clock, config.unresponsive_timeout_ms / 1000.0)

    @property
    def unresponsive_timeout_s(self) -> float:
        return self._timeout

    # --- the heartbeat path ------------------------------------------------------------------

    def heartbeat(
        self,
        instance: NodeInstance,
        registration: TSRegistration | None = None,
        num_leaders: int | None = None,
    ) -> HeartbeatOutcome:
        """Handle steps 1-3 of a heartbeat (module docstring) and say what to answer.
        `num_leaders` is the server's own count of replicas it leads (kept for listings).

        Raises `FailedPrecondition` for a registration from a former process (lower seqno).
        """
        self.heartbeats_received += 1
        now = self._clock.monotonic()
        known = self._records.get(instance.permanent_uuid)
        if known is not None and not known.is_live(now, self._timeout):
            self.revivals += 1
        restarted = False
        if registration is not None:
            restarted = self._register(instance, registration)
        record = self._records.get(instance.permanent_uuid)
        if record is None or not record.matches(instance):
            return HeartbeatOutcome(needs_reregister=True, needs_full_report=True)
        record.heartbeat(now)
        if num_leaders is not None:
            record.num_leaders = num_leaders
        return HeartbeatOutcome(
            needs_reregister=False,
            needs_full_report=record.full_report_pending,
            descriptor=self._snapshot(record, now),
            report_token=record.token(),
            restarted=restarted,
        )

    def register(self, instance: NodeInstance, registration: TSRegistration) -> TSDescriptor:
        """Register (or re-register) a tablet server instance; counts as a heartbeat."""
        self._register(instance, registration)
        return self._snapshot(self._records[instance.permanent_uuid], self._clock.monotonic())

    def _register(self, instance: NodeInstance, registration: TSRegistration) -> bool:
        # A tablet server's instance seqno is the wall-clock time it started, in microseconds.
        # One far in the future would be a restart no later process of that server could
        # follow (every real seqno below it refused): refused, changing nothing.
        ahead_us = instance.instance_seqno - int(self._clock.now() * 1_000_000)
        if ahead_us > MAX_SEQNO_AHEAD_S * 1_000_000:
            raise InvalidArgument(
                f"instance_seqno {instance.instance_seqno} of {instance.permanent_uuid} is "
                f"{ahead_us / 3.6e9:.1f} hours ahead of this master's clock: a server's seqno is "
                f"its start time in microseconds (check the clocks; at most {MAX_SEQNO_AHEAD_S}s "
                "ahead is accepted)"
            )
        now = self._clock.monotonic()
        record = self._records.get(instance.permanent_uuid)
        if record is None:
            self._records[instance.permanent_uuid] = TSRecord.register_new(
                instance, registration, now
            )
            self.addresses_version += 1
            return False
        before = record.registration.rpc_addresses[0]
        restarted = record.register(instance, registration, now)
        if record.registration.rpc_addresses[0] != before:
            self.addresses_version += 1
        return restarted

    def lookup(self, instance: NodeInstance) -> TSDescriptor | None:
        """The descriptor if exactly this instance is registered (uuid and seqno), else None."""
        record = self._records.get(instance.permanent_uuid)
        if record is None or not record.matches(instance):
            return None
        return self._snapshot(record, self._clock.monotonic())

    # --- full tablet reports -----------------------------------------------------------------

    def request_full_reports(self) -> int:
        """Ask every registered server for a full tablet report; returns how many.

        Called by a master when it becomes leader (KUDU-1374), before it processes reports.
        Liveness is untouched: nobody is marked dead or unknown by an election.
        """
        for record in self._records.values():
            record.request_full_report()
        return len(self._records)

    def needs_full_report(self, uuid: str) -> bool:
        """A full report is due from `uuid` (True for an unknown server: it must register)."""
        record = self._records.get(NodeId(uuid))
        return record is None or record.full_report_pending

    def full_reports_due(self) -> int:
        """Registered servers whose full report is still wanted (a walk of the registry: for
        /metrics, not for every heartbeat)."""
        return sum(r.full_report_pending for r in self._records.values())

    def full_report_processed(self, token: ReportToken) -> bool:
        """Record that the full report answering `token` has been processed.

        Returns False (and keeps the report due) if the token is stale: a newer request or a
        restart of the server happened meanwhile.
        """
        record = self._records.get(token.uuid)
        return record is not None and record.full_report_processed(token)

    # --- readers -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._records

    def uuids(self) -> Iterator[NodeId]:
        """Registered uuids, sorted."""
        return iter(sorted(self._records))

    def get(self, uuid: str) -> TSDescriptor | None:
        record = self._records.get(NodeId(uuid))
        return None if record is None else self._snapshot(record, self._clock.monotonic())

    def rpc_address(self, uuid: str) -> str | None:
        """The preferred rpc address `uuid` registered with most recently (live or not), or
        None if it never registered here. Cheap (no `TSDescriptor` snapshot): GetTableLocations
        resolves every replica it returns through it, so a server that re-registered at a new
        address is found there (as Kudu resolves replicas through its TSManager)."""
        record = self._records.get(NodeId(uuid))
        return None if record is None else record.registration.rpc_addresses[0]

    def descriptors(self) -> tuple[TSDescriptor, ...]:
        """Every registered server, live or dead, sorted by uuid, all as of one instant."""
        now = self._clock.monotonic()
        return tuple(self._snapshot(self._records[u], now) for u in sorted(self._records))

    def live_descriptors(self) -> tuple[TSDescriptor, ...]:
        return tuple(d for d in self.descriptors() if d.live)

    def is_live(self, uuid: str) -> bool:
        record = self._records.get(NodeId(uuid))
        return record is not None and record.is_live(self._clock.monotonic(), self._timeout)

    def num_live(self) -> int:
        now = self._clock.monotonic()
        return sum(r.is_live(now, self._timeout) for r in self._records.values())

    def silent_for(self, seconds: float) -> list[str]:
        """Servers whose last heartbeat is at least `seconds` old, sorted (cheap: no
        snapshots; the background tasks ask every round which servers to evict)."""
        now = self._clock.monotonic()
        return sorted(u for u, r in self._records.items() if r.heartbeat_age(now) >= seconds)

    def presumed_dead(self, uuid: str) -> bool:
        """Safe to treat `uuid` as dead (for evicting its replicas).

        A registered server: not live. An unknown one: only once this manager has been up for a
        whole unresponsive timeout, since a live server heartbeats well within it; before that
        "unknown" just means "not heard from yet" (a freshly started master).
        """
        now = self._clock.monotonic()
        record = self._records.get(NodeId(uuid))
        if record is None:
            return now - self._created >= self._timeout
        return not record.is_live(now, self._timeout)

    # --- replica counts (pushed by the catalog) ----------------------------------------------

    def replica_counts(self, uuid: str) -> Mapping[str, int]:
        """Table id -> replicas of it on `uuid`, as last pushed by the catalog (read-only)."""
        counts = self._counts.get(uuid)
        return _NO_COUNTS if counts is None else MappingProxyType(dict(counts))

    def set_replica_counts(self, uuid: str, by_table: Mapping[str, int]) -> None:
        """Replace the per-table replica counts of one server."""
        clean = _clean_counts(uuid, by_table)
        if clean:
            self._counts[uuid] = clean
        else:
            self._counts.pop(uuid, None)

    def replace_replica_counts(self, counts: Mapping[str, Mapping[str, int]]) -> None:
        """Replace every server's counts at once (after the catalog reloads or recounts);
        servers not named have none."""
        fresh = {uuid: _clean_counts(uuid, by_table) for uuid, by_table in counts.items()}
        self._counts = {uuid: c for uuid, c in fresh.items() if c}

    def adjust_replica_count(self, uuid: str, table_id: str, delta: int) -> None:
        """Add `delta` (may be negative) to one server's replicas of one table, as the catalog
        commits a placement or an eviction. A count may not go below zero."""
        counts = self._counts.setdefault(uuid, {})
        new = counts.get(table_id, 0) + delta
        if new < 0:
            if not counts:
                del self._counts[uuid]
            raise InvalidArgument(
                f"replicas of table {table_id} on {uuid} would become {new}"
                f" ({counts.get(table_id, 0)} {delta:+d})"
            )
        if new:
            counts[table_id] = new
        else:
            counts.pop(table_id, None)
        if not counts:
            del self._counts[uuid]

    # --- placement -----------------------------------------------------------------------------

    def server_loads(self) -> tuple[ServerLoad, ...]:
        """Every registered server as `placement_policy` sees it (dead ones with live=False, so
        placement errors can name them), sorted by uuid, as of one instant. Built from the
        records directly, not from `TSDescriptor` snapshots: every assignment round asks."""
        now = self._clock.monotonic()
        out = []
        for u in sorted(self._records):
            r = self._records[u]
            counts = self._counts.get(u, _NO_COUNTS)
            out.append(
                ServerLoad.unchecked(  # counts kept by the catalog: non-negative, copied here
                    u,
                    r.is_live(now, self._timeout),
                    sum(counts.values()),
                    MappingProxyType(dict(counts)),
                    r.registration.location,
                )
            )
        return tuple(out)

    def rpc_addresses(self) -> dict[str, str]:
        """Every registered server's preferred rpc address (cheap: no snapshots)."""
        return {u: r.registration.rpc_addresses[0] for u, r in self._records.items()}

    def _snapshot(self, record: TSRecord, now: float) -> TSDescriptor:
        return record.snapshot(now, self._timeout, self._counts.get(record.uuid, _NO_COUNTS))


def _clean_counts(uuid: str, by_table: Mapping[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for table_id, n in by_table.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument(f"replicas of table {table_id} on {uuid}: got {n!r}")
        if n:
            out[table_id] = n
    return out
