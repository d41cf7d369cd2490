"""What the reconciliation jobs find, as PURE functions of an `Inventory`.

Theory of operation
-------------------
Each function reads an inventory (the catalog as of one committed index, and what every tablet
server lists) and returns `Finding`s: what is wrong, where, and the action that would fix it.
The job modules decide whether to act (`--apply`); nothing here performs I/O, so the same
findings come out of a live cluster, a saved audit snapshot or a synthetic catalog of 100,000
tablets.

Orphan sweep (docs/design/failover.md#R6; Kudu's ksck and HBase's HBCK2):

* `orphan_replica`: a tablet server hosts a replica of a tablet the catalog has never heard
  of. **Reported, never deleted**: it may be the only copy of data whose record was lost, and
  a tablet created after the catalog dump looks the same.
* `replica_of_deleted_tablet`: the tablet is DELETED or REPLACED, or its table REMOVED, yet a
  server still has its data. Fix: DeleteTablet(DELETED) with compare-and-set on the replica's
  config op index.
* `replica_not_in_config`: the tablet is live but this server is not in its committed config
  (evicted by 3-4-3, moved by the rebalancer) and still holds data. Fix: DeleteTablet
  (TOMBSTONED: its consensus metadata stays, so it can still vote in an old term:
  docs/design/tablet_copy.md#R3), with compare-and-set on the catalog's config op index (the
  config the decision rests on). Skipped when the replica's own config is *newer* than the
  catalog's (the catalog dump predates a config change that added it).
* `tablet_without_live_replica`: a RUNNING tablet none of whose configured replicas is running
  on a live, reachable server. Reported: only an operator can decide to recreate it.
* `tablet_stuck_creating`: PREPARING or CREATING for longer than the assignment timeout (the
  master normally replaces such a tablet itself). Reported.

Schema-version audit:

* `stale_schema_replica`: a running replica of a live table at a schema version below the
  table's. Fix: send AlterSchema with the table's schema to the tablet's leader (idempotent:
  the leader replicates it through Raft to every replica that lacks it).
* `table_stuck_altering`: a table ALTERING although every listed replica reports the current
  version or none can be asked. Reported.

Tombstoned and deleted replicas (data state TOMBSTONED, DELETED) are expected leftovers of
Raft membership changes and are never findings.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from spark_jobs.inventory import HostedRow, Inventory

__all__ = ["Finding", "orphan_findings", "schema_findings"]

_GONE_DATA = frozenset({"TOMBSTONED", "DELETED"})
_DEAD_TABLETS = frozenset({"DELETED", "REPLACED"})


@dataclass(frozen=True)
class Finding:
    """One thing a job found. `action` says what --apply does (or "report")."""

    job: str
    kind: str
    table_id: str = ""
    table_name: str = ""
    tablet_id: str = ""
    ts_uuid: str = ""
    detail: str = ""
    action: str = "report"
    cas_config_opid_index: int = 0

    def key(self) -> tuple[str, str, str, str]:
        return (self.kind, self.table_name, self.tablet_id, self.ts_uuid)


def _holds_data(h: HostedRow) -> bool:
    return h.data_state not in _GONE_DATA


def orphan_findings(
    inv: Inventory, *, now_us: int, assignment_timeout_us: int = 30_000_000
) -> list[Finding]:
    job = "orphan_sweep"
    tablets = {t.tablet_id: t for t in inv.tablets}
    tables = {t.table_id: t for t in inv.tables}
    members: dict[str, set[str]] = defaultdict(set)
    for r in inv.replicas:
        members[r.tablet_id].add(r.ts_uuid)
    out: list[Finding] = []
    for h in inv.hosted:
        if not _holds_data(h):
            continue
        tablet = tablets.get(h.tablet_id)
        if tablet is None:
            out.append(
                Finding(
                    job,
                    "orphan_replica",
                    h.table_id,
                    h.table_name,
                    h.tablet_id,
                    h.ts_uuid,
                    "no catalog record for this tablet; reported, never deleted",
                )
            )
            continue
        table = tables.get(tablet.table_id)
        name = table.name if table is not None else h.table_name
        if tablet.state in _DEAD_TABLETS or (table is not None and table.state == "REMOVED"):
            why = (
                f"tablet is {tablet.state}"
                if tablet.state in _DEAD_TABLETS
                else f"table {name!r} was deleted"
            )
            out.append(
                Finding(
                    job,
                    "replica_of_deleted_tablet",
                    tablet.table_id,
                    name,
                    h.tablet_id,
                    h.ts_uuid,
                    f"{why}; the server still holds {h.row_count} rows",
                    "delete",
                    h.config_opid_index,
                )
            )
            continue
        if (
            tablet.state == "RUNNING"
            and h.ts_uuid not in members[h.tablet_id]
            and h.config_opid_index <= tablet.config_opid_index
        ):
            out.append(
                Finding(
                    job,
                    "replica_not_in_config",
                    tablet.table_id,
                    name,
                    h.tablet_id,
                    h.ts_uuid,
                    f"not in the committed config (op index {tablet.config_opid_index}); "
                    f"replica's own config is at {h.config_opid_index}",
                    "tombstone",
                    # The decision's basis: the catalog's config, which excludes the replica
                    # (docs/design/catalog.md#R15): refused if the replica is a voter of a newer
                    # config of its own, or of this one.
                    tablet.config_opid_index,
                )
            )
    out.extend(_unavailable_tablets(inv, job))
    for t in inv.tablets:
        if (
            t.state in ("PREPARING", "CREATING")
            and now_us - t.created_time_us > assignment_timeout_us
        ):
            table = tables.get(t.table_id)
            age_s = (now_us - t.created_time_us) / 1e6
            chosen = sorted(members[t.tablet_id])
            out.append(
                Finding(
                    job,
                    "tablet_stuck_creating",
                    t.table_id,
                    table.name if table is not None else "",
                    t.tablet_id,
                    "",
                    f"{t.state} for {age_s:.0f}s (assignment timeout "
                    f"{assignment_timeout_us / 1e6:.0f}s); "
                    + (f"replicas on {', '.join(chosen)}" if chosen else "no replicas chosen"),
                )
            )
    return sorted(out, key=Finding.key)


def _unavailable_tablets(inv: Inventory, job: str) -> Iterable[Finding]:
    servers = {s.ts_uuid: s for s in inv.tservers}
    usable = {u for u, s in servers.items() if s.live and s.reachable}
    hosted = {(h.tablet_id, h.ts_uuid): h for h in inv.hosted}
    running: set[tuple[str, str]] = {
        k
        for k, h in hosted.items()
        if h.state == "RUNNING" and _holds_data(h) and h.ts_uuid in usable
    }

    def why(tablet_id: str, ts_uuid: str) -> str:
        s = servers.get(ts_uuid)
        if s is None:
            return f"{ts_uuid} (not registered)"
        if not s.live:
            return f"{ts_uuid} (not live)"
        if not s.reachable:
            return f"{ts_uuid} (unreachable)"
        h = hosted.get((tablet_id, ts_uuid))
        if h is None:
            return f"{ts_uuid} (lists no such replica)"
        return f"{ts_uuid} (replica {h.state}, data {h.data_state})"

    members: dict[str, list[str]] = defaultdict(list)
    for r in inv.replicas:
        members[r.tablet_id].append(r.ts_uuid)
    by_id = {t.table_id: t for t in inv.tables}
    for t in inv.tablets:
        if t.state != "RUNNING":
            continue
        table = by_id.get(t.table_id)
        if table is None or table.state == "REMOVED":
            continue
        if not any((t.tablet_id, u) in running for u in members[t.tablet_id]):
            yield Finding(
                job,
                "tablet_without_live_replica",
                t.table_id,
                table.name,
                t.tablet_id,
                "",
                f"none of {len(members[t.tablet_id])} configured replicas runs on a live, "
                "reachable tablet server: "
                + (", ".join(why(t.tablet_id, u) for u in members[t.tablet_id]) or "none"),
            )


def schema_findings(inv: Inventory) -> list[Finding]:
    job = "schema_audit"
    tables = {t.table_id: t for t in inv.tables if t.state in ("RUNNING", "ALTERING")}
    tablets = {t.tablet_id: t for t in inv.tablets if t.state == "RUNNING"}
    members = {(r.tablet_id, r.ts_uuid) for r in inv.replicas}
    out: list[Finding] = []
    stale_tables: set[str] = set()
    for h in inv.hosted:
        tablet = tablets.get(h.tablet_id)
        if tablet is None or not _holds_data(h) or h.state != "RUNNING":
            continue
        if (h.tablet_id, h.ts_uuid) not in members:
            continue  # the orphan sweep's business
        table = tables.get(tablet.table_id)
        if table is None or h.schema_version >= table.schema_version:
            continue
        stale_tables.add(table.table_id)
        out.append(
            Finding(
                job,
                "stale_schema_replica",
                table.table_id,
                table.name,
                h.tablet_id,
                h.ts_uuid,
                f"replica at schema version {h.schema_version}, table at {table.schema_version}",
                "alter_schema",
            )
        )
    for t in tables.values():
        if t.state == "ALTERING" and t.table_id not in stale_tables:
            out.append(
                Finding(
                    job,
                    "table_stuck_altering",
                    t.table_id,
                    t.name,
                    detail=f"ALTERING at version {t.schema_version}, yet no listed replica "
                    "is behind it",
                )
            )
    return sorted(out, key=Finding.key)
