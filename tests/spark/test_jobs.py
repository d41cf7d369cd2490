"""The reconciliation jobs and the Delta audit, with real Spark on a real local cluster.

Planted problems: an orphan replica (a tablet created directly on a tablet server),
stale-schema replicas and replicas of a deleted table. To make them stay put, the masters run
with the SKIP failpoint (service.common.failpoints): they never send AlterSchema or
DeleteTablet, as a master that crashed before its side effects. Each job finds exactly the
planted problems, `--apply` fixes what may be fixed, a second run is clean (the orphan is
reported again: it is never deleted), and the audit tables show before and after.

The last tests plant the orphan sweep's other kinds, each in tables of its own (the cluster
carries the earlier tests' leftovers, so they look only at their own tables' findings): a
replica left behind by a move (`replica_not_in_config`), and a tablet server killed under
one-replica tables (`tablet_without_live_replica`, `tablet_stuck_creating`). A CREATING tablet
stuck past the timeout is planted; a PREPARING one cannot be (CreateTable refuses a replication
factor above the live servers, and a replacement tablet becomes unplaceable only once servers
are declared dead, a minute later): tests/spark/test_reconcile_units.py covers it.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from service.client.replica_ops import move_replica
from service.client.sync import SyncClient
from service.common import failpoints
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.pb import tserver_pb2_grpc
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import create_request
from spark_jobs.audit import read_snapshot, write_snapshot
from spark_jobs.inventory import TabletRow, catalog_rows, list_hosted
from spark_jobs.jobs import audit_snapshot, orphan_sweep, rebalance_plan, schema_audit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
PS = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))
ONE_TABLET = PartitionSchema(range=RangeSchema(()))
SKIP = "AlterReplicas,AlterReplica,DeleteReplicas,DeleteReplica"


class Planted:
    def __init__(self, cluster: MiniCluster, client: SyncClient, orphan: str) -> None:
        self.cluster = cluster
        self.client = client
        self.orphan = orphan
        self.masters = ",".join(cluster.master_addresses)
        # Every job run below passes the admin's credentials with --masters.
        self.credentials = ["--credentials", cluster.credentials_dir() or ""]


@pytest.fixture(scope="module")
def planted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Planted]:
    base = tmp_path_factory.mktemp("jobs-cluster")
    os.environ[failpoints.SKIP] = SKIP  # inherited by the master processes only while starting
    try:
        cluster = MiniCluster(base, master_overrides=dict(FAST_RAFT))
        cluster.start()
    finally:
        del os.environ[failpoints.SKIP]
    try:
        with SyncClient(
            cluster.master_addresses, timeout=60, credentials=cluster.credentials()
        ) as c:
            for name in ("keep", "doomed", "altered"):
                c.call("create_table", name, SCHEMA, PS)
            ts1 = cluster.tservers["ts-1"]
            orphan = uuid.uuid4().hex
            with cluster.sync_channel(ts1.address) as ch:
                tserver_pb2_grpc.TabletServerAdminServiceStub(ch).CreateTablet(
                    create_request(ts1.uuid, orphan, [(ts1.uuid, ts1.address)]), timeout=10
                )
            c.call("delete_table", "doomed")
            c.call("alter_table", "altered", [AddColumn("extra", ColumnType.INT32)], wait=False)
            yield Planted(cluster, c, orphan)
    finally:
        cluster.stop()


def findings(spark: SparkSession, run_id: str) -> list[tuple[str, str, str]]:
    rows = spark.sql(
        f"SELECT kind, table_name, outcome FROM tessera_audit.findings WHERE run_id = '{run_id}'"
    ).collect()
    return sorted((r.kind, r.table_name, r.outcome) for r in rows)


def test_audit_snapshot_is_idempotent_and_time_travels(
    spark: SparkSession, planted: Planted
) -> None:
    args = [
        "--masters",
        planted.masters,
        *planted.credentials,
        "--snapshot-id",
        "before",
        "--run-id",
        "audit-1",
    ]
    assert audit_snapshot.main(args) == 0
    assert audit_snapshot.main(args) == 0  # a retry appends nothing twice
    counts = spark.sql(
        "SELECT count(*) FROM tessera_audit.tablets WHERE snapshot_id = 'before'"
    ).collect()[0][0]
    assert counts == 9  # keep, doomed (DELETED) and altered: 3 tablets each
    inv = read_snapshot(spark, "before")
    assert {t.name for t in inv.tables} == {"keep", "doomed", "altered"}
    assert len(inv.replicas) == 27 and len(inv.tservers) == 3
    assert any(h.tablet_id == planted.orphan for h in inv.hosted)
    history = spark.sql("DESCRIBE HISTORY tessera_audit.tables").collect()
    assert len(history) == 1  # one commit (plus none for the retry)
    # A snapshot of a catalog that has not moved since writes nothing.
    same = dataclasses.replace(inv, stamp=dataclasses.replace(inv.stamp, snapshot_id="again"))
    done = write_snapshot(spark, same)
    assert (done.status, done.previous) == ("unchanged", "before")
    assert spark.sql("SELECT count(*) FROM tessera_audit.snapshots").collect()[0][0] == 1
    # Who took it: the cluster identity of the job's credentials, and the OS user.
    (who,) = spark.sql(
        "SELECT run_by, os_user FROM tessera_audit.snapshots WHERE snapshot_id = 'before'"
    ).collect()
    assert who.run_by.startswith("admin ") and who.os_user


def test_jobs_find_fix_and_come_back_clean(spark: SparkSession, planted: Planted) -> None:
    m = ["--masters", planted.masters, *planted.credentials]
    assert orphan_sweep.main([*m, "--run-id", "orphans-1"]) == 2
    runners = spark.sql(
        "SELECT DISTINCT run_by FROM tessera_audit.findings WHERE run_id = 'orphans-1'"
    ).collect()
    assert [r.run_by for r in runners] and all(r.run_by.startswith("admin ") for r in runners)
    found = findings(spark, "orphans-1")
    assert (
        found
        == [("orphan_replica", "t", "reported")]
        + [("replica_of_deleted_tablet", "doomed", "dry run")] * 9
    )
    assert schema_audit.main([*m, "--run-id", "schema-1"]) == 2
    assert findings(spark, "schema-1") == [("stale_schema_replica", "altered", "dry run")] * 9

    # Offline, against the snapshot saved before: the same findings.
    assert orphan_sweep.main(["--snapshot", "before", "--run-id", "orphans-offline"]) == 2
    assert [f[:2] for f in findings(spark, "orphans-offline")] == [f[:2] for f in found]

    assert orphan_sweep.main([*m, "--apply", "--run-id", "orphans-2"]) == 2
    assert (
        findings(spark, "orphans-2")
        == [("orphan_replica", "t", "reported")]
        + [("replica_of_deleted_tablet", "doomed", "deleted")] * 9
    )
    assert schema_audit.main([*m, "--apply", "--run-id", "schema-2"]) == 2
    assert {f[2] for f in findings(spark, "schema-2")} == {"altered: leader at version 1"}

    # Second runs: clean, except the orphan, which is reported forever and never deleted.
    deadline = time.monotonic() + 30
    while schema_audit.main([*m, "--run-id", f"schema-3-{time.monotonic()}"]) != 0:
        assert time.monotonic() < deadline, "stale replicas did not catch up"
        time.sleep(1)
    assert orphan_sweep.main([*m, "--run-id", "orphans-3"]) == 2
    assert findings(spark, "orphans-3") == [("orphan_replica", "t", "reported")]
    info = planted.client.call("open_table", "altered", refresh=True)
    assert info.schema.has_column("extra")

    # The audit shows before and after.
    assert audit_snapshot.main([*m, "--snapshot-id", "after", "--run-id", "audit-2"]) == 0
    per_snapshot = dict(
        spark.sql(
            "SELECT snapshot_id, count(*) FROM tessera_audit.hosted_replicas_history "
            "WHERE table_name = 'doomed' GROUP BY snapshot_id"
        ).collect()
    )
    assert per_snapshot == {"before": 9}
    v0 = spark.sql("SELECT count(*) FROM tessera_audit.snapshots VERSION AS OF 0").collect()[0][0]
    assert v0 == 1


def test_bad_arguments_exit_1(planted: Planted, capsys: pytest.CaptureFixture[str]) -> None:
    assert orphan_sweep.main(["--snapshot", "latest", "--apply"]) == 1
    assert "--apply acts on a live cluster" in capsys.readouterr().err
    assert schema_audit.main(["--snapshot", "no-such-snapshot"]) == 1
    assert "no-such-snapshot" in capsys.readouterr().err
    assert orphan_sweep.main([]) == 1  # no source given


def test_documented_audit_queries_run(spark: SparkSession, planted: Planted) -> None:
    """Every SQL block of docs/audit_queries.md runs against the audit tables (this module's
    earlier tests took the snapshots `before` and `after`)."""
    planted.client.call("create_table", "fresh", SCHEMA, PS)
    planted.client.call("delete_table", "keep")
    assert (
        audit_snapshot.main(
            ["--masters", planted.masters, *planted.credentials, "--snapshot-id", "third"]
        )
        == 0
    )
    doc = (Path(__file__).resolve().parents[2] / "docs" / "audit_queries.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", doc, flags=re.S)
    assert len(queries) >= 7
    # The example time: the commit time of the first snapshot instead.
    first = spark.sql("DESCRIBE HISTORY tessera_audit.tables").orderBy("version").first()
    assert first is not None
    queries = [
        re.sub(r"TIMESTAMP AS OF '[^']*'", f"TIMESTAMP AS OF '{first.timestamp}'", q)
        for q in queries
    ]
    results = [spark.sql(q).collect() for q in queries]
    assert all(results[:4]), "the snapshot queries return rows"
    diff = {r.name: r.change for r in results[4]}
    assert diff == {
        "altered": "unchanged",
        "doomed": "unchanged",
        "fresh": "created",
        "keep": "dropped",
    }
    moved = {r.change for r in results[5]}
    # fresh's replicas came; a deleted table's tablet records keep their last config.
    assert moved == {"added"}
    # The current table is the latest snapshot's catalog, once per table, and its change feed
    # the diff: keep went REMOVED, fresh came.
    names = [r.name for r in spark.sql("SELECT name FROM tessera_audit.tables").collect()]
    assert sorted(names) == sorted(set(names)) and "fresh" in names
    changes = {(r.name, r._change_type, r.state) for r in results[-1]}
    assert ("fresh", "insert", "RUNNING") in changes
    assert ("keep", "update_postimage", "REMOVED") in changes


def test_rebalance_plan_saved_reviewed_and_applied(spark: SparkSession, planted: Planted) -> None:
    """A fourth, empty tablet server: the job plans moves and saves the plan (dry run);
    --apply-plan executes it; the next run finds the cluster balanced."""
    cluster = planted.cluster
    cluster.add_tserver_slot("ts-4")
    cluster.start_tserver("ts-4")
    cluster.wait_registered()
    m = ["--masters", planted.masters, *planted.credentials]
    assert rebalance_plan.main([*m, "--run-id", "plan-1"]) == 2
    kinds = {f[0] for f in findings(spark, "plan-1")}
    assert "table_imbalance" in kinds
    plan = spark.sql(
        "SELECT to_ts, max_table_skew_after, cluster_skew_after "
        "FROM tessera_audit.rebalance_plans WHERE plan_id = 'plan-1'"
    ).collect()
    assert plan and {r.to_ts for r in plan} == {cluster.tservers["ts-4"].uuid}
    assert all(r.max_table_skew_after <= 1 and r.cluster_skew_after <= 1 for r in plan)
    assert rebalance_plan.main([*m, "--apply-plan", "plan-1", "--max-moves-per-server", "2"]) == 0
    deadline = time.monotonic() + 60
    while rebalance_plan.main([*m, "--run-id", f"plan-check-{time.monotonic()}"]) != 0:
        assert time.monotonic() < deadline, "not balanced after the plan ran"
        time.sleep(2)
    assert rebalance_plan.main([*m, "--apply-plan", "no-such-plan"]) == 1


# --- the orphan sweep's other kinds, planted -------------------------------------------------


def table_findings(spark: SparkSession, run_id: str, table: str) -> list[tuple[str, ...]]:
    """(kind, tablet_id, ts_uuid, outcome, detail) of one table's findings in one run."""
    rows = spark.sql(
        "SELECT kind, tablet_id, ts_uuid, outcome, detail FROM tessera_audit.findings "
        f"WHERE run_id = '{run_id}' AND table_name = '{table}'"
    ).collect()
    return sorted(tuple(r) for r in rows)


def tablets_of(client: SyncClient, table: str) -> dict[str, tuple[TabletRow, list[str]]]:
    """Tablet id -> (its catalog row, the servers of its committed config), from DumpCatalog."""
    dump = client.call("dump_catalog", include_removed=True)
    tables, tablets, replicas = catalog_rows(dump.tables, dump.tablets)
    (table_id,) = [t.table_id for t in tables if t.name == table and t.state != "REMOVED"]
    return {
        t.tablet_id: (t, sorted(r.ts_uuid for r in replicas if r.tablet_id == t.tablet_id))
        for t in tablets
        if t.table_id == table_id
    }


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"after {timeout:.0f}s: {what}"
        time.sleep(0.2)


def test_replica_left_behind_by_a_move_is_tombstoned(spark: SparkSession, planted: Planted) -> None:
    """replica_not_in_config, for real: a one-replica tablet is moved from server A to B as
    the rebalancer moves it (B added as a non-voter, copied, promoted; A steps down and is
    removed). A's next report would get it tombstoned by the master (report processing, step 4),
    but these masters skip DeleteReplica, as one that crashed first would: A keeps its data. The
    sweep names the tablet and A; --apply tombstones it, compare-and-set on A's own config op
    index; the next run finds nothing in the table."""
    c, cluster = planted.client, planted.cluster
    c.call("create_table", "moved", SCHEMA, ONE_TABLET, num_replicas=1)
    rows = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]})
    assert not c.write("moved", rows).errors
    ((tablet_id, (_, (src,))),) = tablets_of(c, "moved").items()
    dst = next(ts.uuid for ts in cluster.tservers.values() if ts.alive and ts.uuid != src)
    c.run(move_replica(c.client, tablet_id, src, dst, timeout=60))
    wait_for(
        "the catalog records the move",
        lambda: tablets_of(c, "moved")[tablet_id][1] == [dst],
    )
    source = cluster.tserver_by_uuid(src)
    left, _ = list_hosted(src, source.address, credentials_dir=planted.cluster.credentials_dir())
    assert [(h.tablet_id, h.data_state) for h in left if h.tablet_id == tablet_id] == [
        (tablet_id, "READY")
    ]

    m = ["--masters", planted.masters, *planted.credentials]
    assert orphan_sweep.main([*m, "--run-id", "moved-1"]) == 2
    ((kind, tablet, ts, outcome, _),) = table_findings(spark, "moved-1", "moved")
    assert (kind, tablet, ts, outcome) == ("replica_not_in_config", tablet_id, src, "dry run")

    assert orphan_sweep.main([*m, "--apply", "--run-id", "moved-2"]) == 2
    assert [f[:4] for f in table_findings(spark, "moved-2", "moved")] == [
        ("replica_not_in_config", tablet_id, src, "tombstoned")
    ]
    left, _ = list_hosted(src, source.address, credentials_dir=planted.cluster.credentials_dir())
    assert [h.data_state for h in left if h.tablet_id == tablet_id] == ["TOMBSTONED"]

    assert orphan_sweep.main([*m, "--run-id", "moved-3"]) == 2  # the orphan, forever
    assert table_findings(spark, "moved-3", "moved") == []
    with SyncClient(
        cluster.master_addresses, timeout=60, credentials=cluster.credentials()
    ) as fresh:  # no cached locations
        assert fresh.call("scan", "moved").num_rows == 3  # the moved replica serves the rows


def test_killed_server_leaves_tablets_unavailable_and_stuck_creating(
    spark: SparkSession, planted: Planted
) -> None:
    """tablet_without_live_replica and tablet_stuck_creating, for real. Two one-replica tables
    with one tablet per tablet server (placement spreads a table's tablets first): `lonely`,
    all RUNNING, then a server is killed (SIGKILL) and `stuck` is created at once. The master
    still counts the dead server live (unresponsive_timeout_ms, a minute), so it places one of
    stuck's tablets there; its CreateTablet keeps failing and the tablet stays CREATING (the
    master would replace it after its assignment timeout, 30 s; the job is told 1 s). The sweep
    reports lonely's tablet on that server (no live replica) and stuck's (stuck creating),
    naming the server, and acts on neither. Once the server is back, the master's retry creates
    the tablet and the next run reports neither."""
    c, cluster = planted.client, planted.cluster
    alive = [ts for ts in cluster.tservers.values() if ts.alive]
    n = len(alive)
    by_hash = PartitionSchema(hash=(HashBucketSchema(("id",), n),), range=RangeSchema(()))
    c.call("create_table", "lonely", SCHEMA, by_hash, num_replicas=1)
    lonely = tablets_of(c, "lonely")
    placed = {members[0]: tid for tid, (_, members) in lonely.items()}
    assert sorted(placed) == sorted(ts.uuid for ts in alive), "one tablet per server"
    victim = next(ts for ts in alive if ts.name != "ts-1")  # ts-1 keeps the orphan listed
    unavailable = placed[victim.uuid]

    cluster.kill_tserver(victim.name)
    try:
        c.call("create_table", "stuck", SCHEMA, by_hash, num_replicas=1, wait=False)

        def stuck_placed() -> bool:
            tablets = tablets_of(c, "stuck").values()
            return all(
                (t.state == "CREATING") == (members == [victim.uuid])
                and (t.state == "RUNNING") == (members != [victim.uuid])
                for t, members in tablets
            ) and all(time.time() * 1e6 - t.created_time_us > 1.5e6 for t, _ in tablets)

        wait_for("stuck's tablets placed, all but the dead server's RUNNING", stuck_placed)
        (stuck,) = [tid for tid, (t, _) in tablets_of(c, "stuck").items() if t.state != "RUNNING"]

        m = ["--masters", planted.masters, *planted.credentials]
        sweep = [*m, "--assignment-timeout-s", "1"]
        assert orphan_sweep.main([*sweep, "--apply", "--run-id", "down-1"]) == 2
        ((kind, tablet, ts, outcome, detail),) = table_findings(spark, "down-1", "lonely")
        assert (kind, tablet, ts, outcome) == (
            "tablet_without_live_replica",
            unavailable,
            "",
            "reported",
        )
        assert f"{victim.uuid} (unreachable)" in detail
        ((kind, tablet, ts, outcome, detail),) = table_findings(spark, "down-1", "stuck")
        assert (kind, tablet, ts, outcome) == ("tablet_stuck_creating", stuck, "", "reported")
        assert detail.startswith("CREATING") and f"replicas on {victim.uuid}" in detail
    finally:
        cluster.start_tserver(victim.name)

    # The master's retry creates the tablet. (Were the machine so slow that its assignment
    # timeout ran out first, the tablet would be REPLACED by a new one placed elsewhere: the
    # table is then just as healthy, and as free of findings.)
    wait_for(
        "every tablet of stuck RUNNING once the server is back",
        lambda: all(t.state in ("RUNNING", "REPLACED") for t, _ in tablets_of(c, "stuck").values()),
    )
    wait_for(
        "lonely's tablet running again on the restarted server",
        lambda: any(
            h.tablet_id == unavailable and h.state == "RUNNING"
            for h in list_hosted(
                victim.uuid, victim.address, credentials_dir=cluster.credentials_dir()
            )[0]
        ),
    )
    assert orphan_sweep.main([*sweep, "--run-id", "down-2"]) == 2  # the orphan, forever
    assert table_findings(spark, "down-2", "lonely") == []
    assert table_findings(spark, "down-2", "stuck") == []
