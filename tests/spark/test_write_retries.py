"""Spark task retries and speculative attempts against a transactional write: a task attempt
that staged part of its rows and then failed adds nothing, its retry's rows all land once.

The job runs in its own process on `local[2,3]` (each task may be tried three times: the shared
test session's `local[2]` tries once). Each task of the first stage fails on its first attempt
after staging two thirds of its rows; `insert` makes any duplicate a failed write, not a silent
overwrite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from service.client.sync import SyncClient
from service.common.partition import HashBucketSchema, PartitionSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from spark_jobs.session import REPO_ROOT
from tests.spark.conftest import masters

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("attempt", ColumnType.INT64)], key="id")
ROWS, PARTS = 60_000, 3

JOB = """
import sys
from pyspark import TaskContext
from pyspark.sql.functions import udf
from spark_jobs.session import build_session

masters, creds, base = sys.argv[1:4]
spark = build_session("retry-test", warehouse_dir=base + "/wh", metastore_dir=base + "/ms")
spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "5000")

@udf("long")
def attempt(i):
    ctx = TaskContext.get()
    # The first attempt of every task fails after staging two thirds of its rows.
    if ctx.attemptNumber() == 0 and i % PER == FAIL_AT:
        raise RuntimeError("first attempt fails")
    return ctx.attemptNumber()

df = spark.range(0, ROWS, numPartitions=PARTS).withColumn("attempt", attempt("id"))
(df.write.format("tessera").option("masters", masters).option("credentials", creds)
   .option("table", "retried").option("operation", "insert").mode("append").save())
print("WRITE DONE")
"""
CONSTANTS = (
    f"ROWS, PARTS, PER, FAIL_AT = {ROWS}, {PARTS}, {ROWS // PARTS}, {2 * ROWS // PARTS // 3}\n"
)


def test_a_retried_task_attempt_leaves_no_rows_of_the_failed_one(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    client.call(
        "create_table", "retried", SCHEMA, PartitionSchema(hash=(HashBucketSchema(("id",), 3),))
    )
    script = tmp_path / "job.py"
    script.write_text(CONSTANTS + JOB)
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        code = subprocess.call(
            [sys.executable, str(script), masters(cluster), str(cluster.credentials_dir()),
             str(tmp_path)],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, timeout=500,
            env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin",
                 "SPARK_MASTER_URL": "local[2,3]"},
        )  # fmt: skip
    text = log.read_text(errors="replace")
    assert code == 0 and "WRITE DONE" in text, text[-3000:]
    assert "first attempt fails" in text  # the first attempts did fail
    rows = [r for t in client.scan_tokens("retried") for b in client.scan_batches(t)
            for r in b.to_pylist()]  # fmt: skip
    assert sorted(r["id"] for r in rows) == list(range(ROWS))
    assert {r["attempt"] for r in rows} == {1}  # every row from a retry; none from attempt 0
