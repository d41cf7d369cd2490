"""Every finding kind of `spark_jobs.reconcile` (and the rebalance plan's, whose rules live in
`spark_jobs.jobs.rebalance_plan`), table-driven over small hand-built inventories. No JVM and
no cluster: the findings are pure functions of an `Inventory`, so a regression in a rule shows
up here in milliseconds. `tests/spark/test_jobs.py` plants the same conditions on a
real cluster (where it can) and runs the real jobs.

The base inventory is a healthy cluster: table `t` (schema version 2, RUNNING) with tablet
`tab` (RUNNING, committed config at op index 5) whose three replicas run on live, reachable
servers `ts-a`, `ts-b`, `ts-c`, plus a fourth live server `ts-d` that hosts nothing. Each case
changes a few rows and lists exactly the findings (kind, tablet, server, action, CAS index)
expected: no more, no fewer.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import pytest

from service.rebalance.rebalancing import plan_moves
from spark_jobs.inventory import (
    HostedRow,
    Inventory,
    ReplicaRow,
    SnapshotStamp,
    TableRow,
    TabletRow,
    TServerRow,
)
from spark_jobs.jobs.rebalance_plan import distribution, imbalance_findings
from spark_jobs.reconcile import Finding, orphan_findings, schema_findings

NOW_US = 1_000_000_000_000
TIMEOUT_US = 30_000_000
SERVERS = ("ts-a", "ts-b", "ts-c")


def table(table_id: str = "tid", name: str = "t", **kw: Any) -> TableRow:
    base = TableRow(table_id, name, "RUNNING", 2, 3, "", NOW_US - 10**9, NOW_US - 10**9)
    return replace(base, **kw)


def tablet(tablet_id: str = "tab", table_id: str = "tid", **kw: Any) -> TabletRow:
    base = TabletRow(tablet_id, table_id, "RUNNING", b"", b"", "ts-a", 5, 2, "", NOW_US - 10**9)
    return replace(base, **kw)


def member(ts: str, tablet_id: str = "tab", table_id: str = "tid") -> ReplicaRow:
    return ReplicaRow(tablet_id, table_id, ts, "VOTER", ts == "ts-a", f"{ts}:7050")


def hosted(ts: str, tablet_id: str = "tab", table_id: str = "tid", **kw: Any) -> HostedRow:
    base = HostedRow(
        ts_uuid=ts,
        tablet_id=tablet_id,
        table_id=table_id,
        table_name="t",
        data_state="READY",
        state="RUNNING",
        role="LEADER" if ts == "ts-a" else "FOLLOWER",
        term=3,
        leader_uuid="ts-a",
        schema_version=2,
        config_opid_index=5,
        in_own_config=True,
        row_count=10,
        on_disk_bytes=100,
        error="",
    )
    return replace(base, **kw)


def server(ts: str, **kw: Any) -> TServerRow:
    return replace(TServerRow(ts, f"{ts}:7050", True, 100, 1, 0, True, ""), **kw)


def healthy() -> Inventory:
    return Inventory(
        SnapshotStamp("s", dt.datetime(2025, 1, 1, tzinfo=dt.UTC), 1, 100),
        tables=[table()],
        tablets=[tablet()],
        replicas=[member(u) for u in SERVERS],
        hosted=[hosted(u) for u in SERVERS],
        tservers=[server(u) for u in (*SERVERS, "ts-d")],
    )


def with_hosted(inv: Inventory, ts: str, **kw: Any) -> None:
    """Change the one hosted row of `tab` on `ts`."""
    inv.hosted = [replace(h, **kw) if h.ts_uuid == ts else h for h in inv.hosted]


def with_server(inv: Inventory, ts: str, **kw: Any) -> None:
    inv.tservers = [replace(s, **kw) if s.ts_uuid == ts else s for s in inv.tservers]


def with_tablet(inv: Inventory, **kw: Any) -> None:
    inv.tablets = [replace(t, **kw) for t in inv.tablets]


def with_table(inv: Inventory, **kw: Any) -> None:
    inv.tables = [replace(t, **kw) for t in inv.tables]


Want = tuple[str, str, str, str, int]
"""(kind, tablet_id, ts_uuid, action, cas_config_opid_index) of one expected finding."""


@dataclass(frozen=True)
class Case:
    name: str
    plant: Callable[[Inventory], None]
    want: tuple[Want, ...]


def _orphan(inv: Inventory) -> None:
    inv.hosted.append(hosted("ts-d", "ghost", "gone-table", config_opid_index=0))


def _tablet_deleted(inv: Inventory) -> None:
    with_tablet(inv, state="DELETED")


def _tablet_replaced(inv: Inventory) -> None:
    with_tablet(inv, state="REPLACED", replaced_by_tablet_id="tab2")


def _table_removed(inv: Inventory) -> None:
    with_table(inv, state="REMOVED")
    with_tablet(inv, state="DELETED")


def _table_removed_tablet_record_running(inv: Inventory) -> None:
    # The table's record says REMOVED even if a tablet record still reads RUNNING.
    with_table(inv, state="REMOVED")
    with_hosted(inv, "ts-c", config_opid_index=7)


def _evicted(inv: Inventory) -> None:
    # ts-d was moved out (config op index 5 no longer names it); its data is still there.
    inv.hosted.append(hosted("ts-d", config_opid_index=4, in_own_config=True, role="FOLLOWER"))


def _evicted_knows_it(inv: Inventory) -> None:
    # The removed replica applied the config that removed it: same op index as the catalog's.
    inv.hosted.append(hosted("ts-d", config_opid_index=5, in_own_config=False))


def _added_after_dump(inv: Inventory) -> None:
    # ts-d joined in a config newer than the catalog dump: not a finding (module docstring).
    inv.hosted.append(hosted("ts-d", config_opid_index=6, role="LEARNER"))


def _evicted_already_tombstoned(inv: Inventory) -> None:
    inv.hosted.append(hosted("ts-d", config_opid_index=4, data_state="TOMBSTONED"))
    inv.hosted.append(hosted("ts-d", "tab-x", data_state="DELETED"))


def _evicted_while_creating(inv: Inventory) -> None:
    # Only RUNNING tablets have a committed config worth comparing with.
    with_tablet(inv, state="CREATING", created_time_us=NOW_US - 1_000_000)
    inv.hosted.append(hosted("ts-d", config_opid_index=0))


def _all_servers_down(inv: Inventory) -> None:
    for u in SERVERS:
        with_server(inv, u, live=False, reachable=False, error="connection refused")
    inv.hosted = []


def _unreachable_and_dead(inv: Inventory) -> None:
    with_server(inv, "ts-a", reachable=False, error="deadline exceeded")
    with_server(inv, "ts-b", live=False)  # listed, but its heartbeats stopped
    inv.hosted = [h for h in inv.hosted if h.ts_uuid != "ts-a"]
    with_hosted(inv, "ts-c", state="FAILED", error="disk error")


def _one_survivor(inv: Inventory) -> None:
    with_server(inv, "ts-a", reachable=False)
    with_server(inv, "ts-b", live=False)
    inv.hosted = [h for h in inv.hosted if h.ts_uuid != "ts-a"]


def _only_tombstones_left(inv: Inventory) -> None:
    for u in SERVERS:
        with_hosted(inv, u, data_state="TOMBSTONED", state="TOMBSTONED")


def _running_only_outside_config(inv: Inventory) -> None:
    # The data runs on ts-d, which the config does not name: still no usable replica.
    inv.replicas = [member("ts-a")]
    inv.hosted = [hosted("ts-a", state="BOOTSTRAPPING"), hosted("ts-d", config_opid_index=5)]


def _deleted_table_down(inv: Inventory) -> None:
    # Tablets of deleted tables are never "unavailable", whatever their record says.
    with_table(inv, state="REMOVED")
    _all_servers_down(inv)


def _creating_too_long(inv: Inventory) -> None:
    with_tablet(inv, state="CREATING", created_time_us=NOW_US - TIMEOUT_US - 1)
    inv.hosted = []


def _preparing_too_long(inv: Inventory) -> None:
    # Unplaced (too few live servers for the replication factor): no config yet.
    with_tablet(inv, state="PREPARING", created_time_us=NOW_US - 10 * TIMEOUT_US)
    inv.replicas = []
    inv.hosted = []


def _creating_recently(inv: Inventory) -> None:
    with_tablet(inv, state="CREATING", created_time_us=NOW_US - TIMEOUT_US + 1)
    inv.hosted = []


ORPHAN_CASES = [
    Case("healthy", lambda inv: None, ()),
    Case("orphan replica", _orphan, (("orphan_replica", "ghost", "ts-d", "report", 0),)),
    Case(
        "tablet deleted",
        _tablet_deleted,
        tuple(("replica_of_deleted_tablet", "tab", u, "delete", 5) for u in SERVERS),
    ),
    Case(
        "tablet replaced",
        _tablet_replaced,
        tuple(("replica_of_deleted_tablet", "tab", u, "delete", 5) for u in SERVERS),
    ),
    Case(
        "table removed",
        _table_removed,
        tuple(("replica_of_deleted_tablet", "tab", u, "delete", 5) for u in SERVERS),
    ),
    Case(
        "table removed, tablet record running",
        _table_removed_tablet_record_running,
        (
            ("replica_of_deleted_tablet", "tab", "ts-a", "delete", 5),
            ("replica_of_deleted_tablet", "tab", "ts-b", "delete", 5),
            ("replica_of_deleted_tablet", "tab", "ts-c", "delete", 7),
        ),
    ),
    # The tombstone's compare-and-set is on the catalog's config (5), the one that excludes
    # the replica (docs/design/catalog.md#R15), not on the replica's own (4).
    Case("evicted", _evicted, (("replica_not_in_config", "tab", "ts-d", "tombstone", 5),)),
    Case(
        "evicted, knows it",
        _evicted_knows_it,
        (("replica_not_in_config", "tab", "ts-d", "tombstone", 5),),
    ),
    Case("added after the dump", _added_after_dump, ()),
    Case("evicted and already tombstoned", _evicted_already_tombstoned, ()),
    Case(
        "evicted while creating (young)",
        _evicted_while_creating,
        (),
    ),
    Case(
        "all servers down",
        _all_servers_down,
        (("tablet_without_live_replica", "tab", "", "report", 0),),
    ),
    Case(
        "unreachable, dead, failed",
        _unreachable_and_dead,
        (("tablet_without_live_replica", "tab", "", "report", 0),),
    ),
    Case("one survivor", _one_survivor, ()),
    Case(
        "only tombstones left",
        _only_tombstones_left,
        (("tablet_without_live_replica", "tab", "", "report", 0),),
    ),
    Case(
        "running only outside the config",
        _running_only_outside_config,
        (
            ("replica_not_in_config", "tab", "ts-d", "tombstone", 5),
            ("tablet_without_live_replica", "tab", "", "report", 0),
        ),
    ),
    Case("deleted table, servers down", _deleted_table_down, ()),
    Case(
        "creating too long",
        _creating_too_long,
        (("tablet_stuck_creating", "tab", "", "report", 0),),
    ),
    Case(
        "preparing too long",
        _preparing_too_long,
        (("tablet_stuck_creating", "tab", "", "report", 0),),
    ),
    Case("creating, within the timeout", _creating_recently, ()),
]


def _got(findings: list[Finding]) -> tuple[Want, ...]:
    return tuple(
        (f.kind, f.tablet_id, f.ts_uuid, f.action, f.cas_config_opid_index) for f in findings
    )


@pytest.mark.parametrize("case", ORPHAN_CASES, ids=lambda c: c.name)
def test_orphan_findings(case: Case) -> None:
    inv = healthy()
    case.plant(inv)
    got = orphan_findings(inv, now_us=NOW_US, assignment_timeout_us=TIMEOUT_US)
    assert _got(got) == case.want
    assert all(f.job == "orphan_sweep" for f in got)
    assert schema_findings(inv) == []  # none of these is the schema audit's business


def test_orphan_findings_name_what_they_found() -> None:
    """The details an operator reads: the servers and why none of them serves the tablet,
    the age and the chosen servers of a stuck tablet."""
    inv = healthy()
    _unreachable_and_dead(inv)
    (f,) = orphan_findings(inv, now_us=NOW_US)
    assert f.table_name == "t" and f.table_id == "tid"
    assert "ts-a (unreachable)" in f.detail
    assert "ts-b (not live)" in f.detail
    assert "ts-c (replica FAILED, data READY)" in f.detail

    inv = healthy()
    _creating_too_long(inv)
    (f,) = orphan_findings(inv, now_us=NOW_US, assignment_timeout_us=TIMEOUT_US)
    assert f.detail.startswith("CREATING for 30s (assignment timeout 30s)")
    assert "replicas on ts-a, ts-b, ts-c" in f.detail

    inv = healthy()
    _preparing_too_long(inv)
    (f,) = orphan_findings(inv, now_us=NOW_US, assignment_timeout_us=TIMEOUT_US)
    assert "no replicas chosen" in f.detail

    inv = healthy()
    _orphan(inv)
    (f,) = orphan_findings(inv, now_us=NOW_US)
    assert "never deleted" in f.detail


def test_orphan_findings_are_sorted_and_deterministic() -> None:
    inv = healthy()
    _orphan(inv)
    _evicted(inv)
    inv.hosted.reverse()
    a = orphan_findings(inv, now_us=NOW_US)
    inv.hosted.reverse()
    assert a == orphan_findings(inv, now_us=NOW_US)
    assert [f.kind for f in a] == ["orphan_replica", "replica_not_in_config"]


def _stale(inv: Inventory) -> None:
    with_table(inv, state="ALTERING", schema_version=3)


def _one_stale(inv: Inventory) -> None:
    with_hosted(inv, "ts-b", schema_version=1)


def _altering_but_caught_up(inv: Inventory) -> None:
    with_table(inv, state="ALTERING")


def _altering_nothing_listed(inv: Inventory) -> None:
    with_table(inv, state="ALTERING", schema_version=3)
    inv.hosted = []


def _stale_but_not_running(inv: Inventory) -> None:
    with_table(inv, schema_version=3)
    for u in SERVERS:
        with_hosted(inv, u, state="BOOTSTRAPPING")


def _stale_outside_config(inv: Inventory) -> None:
    # ts-d's stale replica is the orphan sweep's business, not the schema audit's.
    inv.hosted.append(hosted("ts-d", schema_version=1, config_opid_index=4))


def _stale_tombstone(inv: Inventory) -> None:
    with_hosted(inv, "ts-c", schema_version=1, data_state="TOMBSTONED")


def _stale_of_deleted_table(inv: Inventory) -> None:
    with_table(inv, state="REMOVED", schema_version=3)


def _stale_of_replaced_tablet(inv: Inventory) -> None:
    with_table(inv, schema_version=3)
    with_tablet(inv, state="REPLACED")


SCHEMA_CASES = [
    Case("healthy", lambda inv: None, ()),
    Case(
        "every replica behind an ALTERING table",
        _stale,
        tuple(("stale_schema_replica", "tab", u, "alter_schema", 0) for u in SERVERS),
    ),
    Case(
        "one replica behind",
        _one_stale,
        (("stale_schema_replica", "tab", "ts-b", "alter_schema", 0),),
    ),
    Case(
        "altering, every replica caught up",
        _altering_but_caught_up,
        (("table_stuck_altering", "", "", "report", 0),),
    ),
    Case(
        "altering, no replica listed",
        _altering_nothing_listed,
        (("table_stuck_altering", "", "", "report", 0),),
    ),
    Case("behind but not running", _stale_but_not_running, ()),
    Case("behind, outside the config", _stale_outside_config, ()),
    Case("behind, tombstoned", _stale_tombstone, ()),
    Case("behind, table deleted", _stale_of_deleted_table, ()),
    Case("behind, tablet replaced", _stale_of_replaced_tablet, ()),
]


@pytest.mark.parametrize("case", SCHEMA_CASES, ids=lambda c: c.name)
def test_schema_findings(case: Case) -> None:
    inv = healthy()
    case.plant(inv)
    got = schema_findings(inv)
    assert _got(got) == case.want
    assert all(f.job == "schema_audit" and f.table_name == "t" for f in got)


# --- rebalance_plan: table_imbalance, cluster_imbalance, and the tablets it may not move -------


def _three_tablets(inv: Inventory) -> None:
    """Table t with tablets tab, tab1, tab2, each with a voter on ts-a, ts-b and ts-c; ts-d
    live and empty: every server but ts-d holds 3 replicas of t (skew 3, table and cluster)."""
    for i in (1, 2):
        inv.tablets.append(tablet(f"tab{i}"))
        inv.replicas += [member(u, f"tab{i}") for u in SERVERS]


def _three_tablets_ts_d_dead(inv: Inventory) -> None:
    _three_tablets(inv)
    with_server(inv, "ts-d", live=False)


def _without_ts_d(inv: Inventory) -> None:
    _three_tablets(inv)
    inv.tservers = [s for s in inv.tservers if s.ts_uuid != "ts-d"]


def _all_pinned(inv: Inventory) -> None:
    _three_tablets(inv)
    with_table(inv, state="ALTERING")


def _leaderless(inv: Inventory) -> None:
    _three_tablets(inv)
    with_tablet(inv, leader_uuid="")


RebalanceWant = tuple[tuple[str, str], ...]
"""(kind, action) of each expected finding."""


@dataclass(frozen=True)
class RebalanceCase:
    name: str
    plant: Callable[[Inventory], None]
    want: RebalanceWant
    pinned: int


IMBALANCED = (("table_imbalance", "move"), ("cluster_imbalance", "move"))
PINNED_ONLY = (("table_imbalance", "report"), ("cluster_imbalance", "report"))

REBALANCE_CASES = [
    RebalanceCase("one tablet on three of four servers", lambda inv: None, (), 0),
    RebalanceCase("fourth server empty", _three_tablets, IMBALANCED, 0),
    RebalanceCase("fourth server empty but dead", _three_tablets_ts_d_dead, (), 0),
    RebalanceCase("three servers", _without_ts_d, (), 0),
    RebalanceCase("imbalanced, every tablet pinned", _all_pinned, PINNED_ONLY, 3),
    RebalanceCase("imbalanced, no leaders known", _leaderless, PINNED_ONLY, 3),
]


@pytest.mark.parametrize("case", REBALANCE_CASES, ids=lambda c: c.name)
def test_rebalance_findings(case: RebalanceCase) -> None:
    inv = healthy()
    case.plant(inv)
    dist, pinned = distribution(inv)
    moves = plan_moves(dist)
    got = imbalance_findings(inv, dist, moves)
    assert tuple((f.kind, f.action) for f in got) == case.want
    assert len(pinned) == case.pinned
    assert all(f.job == "rebalance_plan" for f in got)
    if case.want == IMBALANCED:
        assert moves and {m.to_ts for m in moves} == {"ts-d"}
        assert got[0].table_name == "t" and "skew 3" in got[0].detail


PINS: list[tuple[Callable[[Inventory], None], str]] = [
    (lambda inv: with_table(inv, state="ALTERING"), "its table is being altered"),
    (
        lambda inv: inv.replicas.append(replace(member("ts-d"), member_type="NON_VOTER")),
        "a config change is under way",
    ),
    (lambda inv: with_tablet(inv, leader_uuid=""), "no known leader"),
    (lambda inv: with_server(inv, "ts-c", live=False), "a voter is on a server that is not live"),
    (lambda inv: with_table(inv, num_replicas=5), "3 voters, replication factor 5"),
]


@pytest.mark.parametrize(("plant", "reason"), PINS, ids=[reason for _, reason in PINS])
def test_rebalance_pins_tablets_it_must_not_move(
    plant: Callable[[Inventory], None], reason: str
) -> None:
    inv = healthy()
    plant(inv)
    _, pinned = distribution(inv)
    assert pinned == {"tab": reason}
