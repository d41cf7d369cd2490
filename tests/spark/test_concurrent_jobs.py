"""Jobs started at the same time, with the default settings, do not fight over a metastore.

Two `audit_snapshot` processes (the hardest pair: both create and write the same Delta tables)
start together against one cluster, sharing one $TESSERA_SPARK_HOME and nothing else. With
Hive's embedded Derby metastore, the default until the catalog became a per-session in-memory
one (spark_jobs/catalog.py), the second JVM got "Another instance of Derby may have already
booted the database" and could fail. Now both succeed, no metastore database exists, and the
audit tables are whole: every snapshot recorded in `snapshots` has all its history rows, once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from service.client.sync import SyncClient
from service.common.partition import PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from spark_jobs.audit import KEYS
from spark_jobs.session import REPO_ROOT
from tests.spark.conftest import masters

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Two job JVMs at once: about a minute on an idle two-core machine, several under load.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

DERBY = "Another instance of Derby"
SCHEMA = Schema.build([("id", ColumnType.INT64)], key="id")


def test_two_jobs_at_once_with_the_default_catalog(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    client.call("create_table", "audited", SCHEMA, PartitionSchema(range=RangeSchema(())))
    home = tmp_path / "spark-home"
    env = {**os.environ, "TESSERA_SPARK_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    env.pop("PYSPARK_GATEWAY_PORT", None)  # a plain Python process, as `tessera jobs run`
    creds = cluster.credentials_dir()
    assert creds is not None
    procs = {
        sid: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_jobs.jobs.audit_snapshot",
                "--masters",
                masters(cluster),
                "--credentials",
                creds,
                "--snapshot-id",
                sid,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for sid in ("first", "second")
    }
    outputs = {}
    try:
        for sid, proc in procs.items():
            outputs[sid] = proc.communicate(timeout=400)[0]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for sid, proc in procs.items():
        assert proc.returncode == 0, (sid, outputs[sid][-4000:])
        assert DERBY not in outputs[sid]
        assert (
            f"audit_snapshot: snapshot {sid}" in outputs[sid] or "nothing written" in (outputs[sid])
        ), outputs[sid][-2000:]
    # No metastore was booted: no Derby database or log anywhere the jobs ran.
    for where in (home, tmp_path):
        assert not list(where.rglob("metastore_db")) and not list(where.rglob("derby.log"))

    # The tables are whole: read by path (this process's catalog is another one).
    audit = home / "warehouse" / "tessera_audit.db"
    snaps = spark.read.format("delta").load(str(audit / "snapshots")).collect()
    assert {s.snapshot_id for s in snaps} <= {"first", "second"} and snaps
    assert len(snaps) == len({s.snapshot_id for s in snaps})
    for kind in KEYS:
        history = spark.read.format("delta").load(str(audit / f"{kind}_history"))
        per_snapshot = dict(history.groupBy("snapshot_id").count().collect())
        for s in snaps:
            assert per_snapshot.get(s.snapshot_id, 0) == s[f"num_{kind}"], (kind, per_snapshot)
        current = spark.read.format("delta").load(str(audit / kind))
        key = list(KEYS[kind])
        assert current.count() == current.select(*key).distinct().count() > 0, kind
