"""Spark reads are snapshots (docs/design/tablets.md#R4): one DataFrame over a table that is
being written reads one table, through every action, task and write of it.

Before snapshots, the tasks of one DataFrame read as many moments as it had tablets, and two
actions on it saw different tables; this module's first test failed that way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.hybrid_time import physical_us
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from tests.spark.conftest import masters, read

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

SCHEMA = Schema.build([("id", ColumnType.INT64), ("n", ColumnType.INT64)], key="id")
HASHED = PartitionSchema(hash=(HashBucketSchema(("id",), 4),), range=RangeSchema(()))


class Inserter:
    """Inserts new rows in the background (the table grows while Spark reads it)."""

    def __init__(self, client: SyncClient, table: str) -> None:
        self.client, self.table = client, table
        self.next = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            ids = list(range(self.next, self.next + 200))
            self.client.write(
                self.table, pa.table({"id": pa.array(ids, pa.int64()), "n": ids}), "insert"
            )
            self.next += 200

    def __enter__(self) -> Inserter:
        self.thread.start()
        while self.next < 1000:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def tables(client: SyncClient) -> Iterator[None]:
    client.call("create_table", "growing", SCHEMA, HASHED, num_replicas=3)
    client.call("create_table", "copy_of_growing", SCHEMA, HASHED, num_replicas=3)
    yield


def test_one_dataframe_reads_one_table_through_every_action_and_its_write(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tables: None
) -> None:
    with Inserter(client, "growing") as ins:
        df = read(spark, cluster, "growing")
        first = df.count()
        time.sleep(1.0)
        assert ins.next > first  # the table grew meanwhile
        second = df.count()
        ids = sorted(r.id for r in df.select("id").collect())
        df.write.format("tessera").option("masters", masters(cluster)).option(
            "credentials", cluster.credentials_dir()
        ).option("table", "copy_of_growing").mode("append").save()
    # One snapshot through every action: the same rows each time. (A plain write to several
    # tablets is not atomic across them, so the rows need not be a prefix of the inserts.)
    assert first == second == len(ids) == len(set(ids))
    copied = sorted(client.call("scan", "copy_of_growing").column("id").to_pylist())
    assert copied == ids
    # A new DataFrame sees the rows added since; read_mode=latest opts out of snapshots.
    assert read(spark, cluster, "growing").count() == ins.next
    assert read(spark, cluster, "growing", read_mode="latest").count() == ins.next


def test_snapshot_timestamp_ms_and_as_of_read_the_table_as_of_then(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tables: None
) -> None:
    now = client.call("scan_tokens", "growing", snapshot=True)[0].snapshot_timestamp
    before = read(spark, cluster, "growing").count()
    client.write(
        "growing",
        pa.table({"id": pa.array([10**9], pa.int64()), "n": pa.array([1], pa.int64())}),
    )
    ms = physical_us(now) // 1000
    assert read(spark, cluster, "growing", snapshot_timestamp_ms=str(ms)).count() == before
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
    assert read(spark, cluster, "growing", as_of=iso).count() == before
    assert read(spark, cluster, "growing").count() == before + 1
    with pytest.raises(Exception, match=r"SNAPSHOT_TOO_OLD|history horizon"):
        read(spark, cluster, "growing", snapshot_timestamp_ms=str(ms - 3_600_000)).count()
    with pytest.raises(Exception, match="read_mode"):
        read(spark, cluster, "growing", read_mode="latest", as_of=iso).count()
