"""The reconciliation jobs and the Delta audit, with real Spark on a real local cluster.

Planted problems (issue 7): an orphan replica (a tablet created directly on a tablet server),
stale-schema replicas and replicas of a deleted table. To make them stay put, the masters run
with the SKIP failpoint (service.common.failpoints): they never send AlterSchema or
DeleteTablet, as a master that crashed before its side effects. Each job finds exactly the
planted problems, `--apply` fixes what may be fixed, a second run is clean (the orphan is
reported again: it is never deleted), and the audit tables show before and after.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from service.client.sync import SyncClient
from service.common import failpoints
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import AddColumn, ColumnType, Schema
from service.pb import tserver_pb2_grpc
from service.testing.master_cluster import FAST_RAFT
from service.testing.mini_cluster import MiniCluster
from service.testing.tablet_fixtures import create_request
from spark_jobs.audit import read_snapshot
from spark_jobs.jobs import audit_snapshot, orphan_sweep, rebalance_plan, schema_audit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("v", ColumnType.STRING)], key="id")
PS = PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(()))
SKIP = "AlterReplicas,AlterReplica,DeleteReplicas,DeleteReplica"


class Planted:
    def __init__(self, cluster: MiniCluster, client: SyncClient, orphan: str) -> None:
        self.cluster = cluster
        self.client = client
        self.orphan = orphan
        self.masters = ",".join(cluster.master_addresses)


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
        with SyncClient(cluster.master_addresses, timeout=60) as c:
            for name in ("keep", "doomed", "altered"):
                c.call("create_table", name, SCHEMA, PS)
            ts1 = cluster.tservers["ts-1"]
            orphan = uuid.uuid4().hex
            with grpc.insecure_channel(ts1.address) as ch:
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
    args = ["--masters", planted.masters, "--snapshot-id", "before", "--run-id", "audit-1"]
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
    assert len(history) == 1  # one append (plus none for the retry)


def test_jobs_find_fix_and_come_back_clean(spark: SparkSession, planted: Planted) -> None:
    m = ["--masters", planted.masters]
    assert orphan_sweep.main([*m, "--run-id", "orphans-1"]) == 2
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
            "SELECT snapshot_id, count(*) FROM tessera_audit.hosted_replicas "
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
    assert audit_snapshot.main(["--masters", planted.masters, "--snapshot-id", "third"]) == 0
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


def test_rebalance_plan_saved_reviewed_and_applied(spark: SparkSession, planted: Planted) -> None:
    """A fourth, empty tablet server: the job plans moves and saves the plan (dry run);
    --apply-plan executes it; the next run finds the cluster balanced."""
    cluster = planted.cluster
    cluster.add_tserver_slot("ts-4")
    cluster.start_tserver("ts-4")
    cluster.wait_registered()
    m = ["--masters", planted.masters]
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
