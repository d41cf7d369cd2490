"""Backup and restore through Delta (spark_jobs/jobs/backup.py, restore.py): a full backup and
an incremental one (one MERGE) make Delta versions 0 and 1; each version restored under a new
name equals a snapshot scan of the original at that backup's timestamp, row for row."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.errors import AlreadyExists, InvalidArgument
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from spark_jobs.jobs import backup as backup_job
from spark_jobs.jobs import restore as restore_job
from spark_jobs.jobs.backup import backup, last_backup
from spark_jobs.jobs.restore import restore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(900)]

SCHEMA = Schema.build(
    [("k", ColumnType.INT64), ("s", ColumnType.STRING), ("x", ColumnType.DOUBLE, True)], key="k"
)
PARTS = PartitionSchema(
    hash=(HashBucketSchema(("k",), 2),), range=RangeSchema(("k",)), split_rows=((500,),)
)


def _rows(ids: list[int], tag: str) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(ids, pa.int64()),
            "s": [f"{tag}{i}" for i in ids],
            "x": pa.array([None if i % 7 == 0 else i / 3 for i in ids], pa.float64()),
        }
    )


def _table(client: SyncClient, name: str, at: int | None = None) -> list[dict[str, object]]:
    t = client.call("scan", name, snapshot=at) if at else client.call("scan", name)
    return sorted(t.to_pylist(), key=lambda r: r["k"])  # type: ignore[arg-type,return-value]


def test_full_then_incremental_backup_and_restore_of_each_version(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    masters = cluster.master_addresses
    creds = cluster.credentials_dir()
    client.call("create_table", "orders", SCHEMA, PARTS, num_replicas=3)
    client.write("orders", _rows(list(range(1000)), "a"))
    dest = str(tmp_path / "orders_backup")

    v0, full, counts0 = backup(spark, client, masters, "orders", dest, credentials_dir=creds)
    assert (v0, full.kind, counts0["rows"]) == (0, "full", 1000)
    t1 = full.snapshot_timestamp

    client.write("orders", _rows(list(range(0, 100, 10)), "b"), "update")
    client.write("orders", pa.table({"k": pa.array(range(1, 30, 3), pa.int64())}), "delete")
    client.write("orders", _rows(list(range(1000, 1020)), "c"), "insert")
    v1, inc, counts1 = backup(spark, client, masters, "orders", dest, credentials_dir=creds)
    assert (v1, inc.kind, inc.previous_timestamp) == (1, "incremental", t1)
    # Key 10 was updated, then deleted: the diff holds its deletion only.
    assert (counts1["updated"], counts1["deleted"], counts1["inserted"]) == (9, 10, 20)
    t2 = inc.snapshot_timestamp

    # The Delta versions are the backup chain.
    at_v0 = spark.read.format("delta").option("versionAsOf", 0).load(dest)
    at_v1 = spark.read.format("delta").option("versionAsOf", 1).load(dest)
    assert at_v0.count() == 1000 and at_v1.count() == 1010
    assert last_backup(spark, dest, 0)[1].snapshot_timestamp == t1  # type: ignore[index]

    # Each version restored equals a snapshot scan of the original at its timestamp.
    for version, at, name in ((0, t1, "orders_v0"), (1, t2, "orders_v1")):
        made, v, info, rows = restore(
            spark, client, masters, dest, version=version, table=name, credentials_dir=creds
        )
        assert (made, v, info.snapshot_timestamp) == (name, version, at)
        assert _table(client, name) == _table(client, "orders", at)
        assert rows == len(_table(client, name))
        handle = client.call("open_table", name)
        assert handle.schema.column_names == SCHEMA.column_names
        assert handle.partition_schema.hash == PARTS.hash and handle.num_replicas == 3

    with pytest.raises(AlreadyExists):
        restore(spark, client, masters, dest, table="orders_v0", credentials_dir=creds)
    with pytest.raises(InvalidArgument, match="holds backups of table"):
        backup(spark, client, masters, "orders_v0", dest, credentials_dir=creds)


def test_the_jobs_command_lines_end_with_one_summary_line(
    spark: SparkSession,
    cluster: MiniCluster,
    client: SyncClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client.call("create_table", "small", SCHEMA, PartitionSchema(), num_replicas=1)
    client.write("small", _rows(list(range(50)), "z"))
    dest = str(tmp_path / "small_backup")
    args = ["--masters", ",".join(cluster.master_addresses), "--table", "small", "--dest", dest]
    creds = cluster.credentials_dir()
    if creds:
        args += ["--credentials", creds]
    assert backup_job.main(args) == 0
    client.write("small", _rows([1, 2], "y"))
    assert backup_job.main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("backup: small incremental at ") and "version 1" in out[-1]
    assert "+0 ~2 -0" in out[-1]
    restore_args = ["--masters", ",".join(cluster.master_addresses), "--source", dest]
    restore_args += ["--table", "small_restored"] + (["--credentials", creds] if creds else [])
    assert restore_job.main(restore_args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("restore: small_restored from ") and ": 50 rows in " in last
    assert _table(client, "small_restored") == _table(client, "small")
