"""Backup and restore through Delta (spark_jobs/jobs/backup.py, restore.py;
docs/design/tablets.md#R7): a full backup and incremental ones make a chain of Delta versions,
each incremental a plain append; `read_backup` of every version, and a restore of any of them
under a new name, equals a snapshot scan of the original at that backup's timestamp, row for
row; a second full backup starts a new chain and leaves the older versions readable; a Delta
table of the old format, or no backup at all, is refused and left as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest

from service.client.sync import SyncClient
from service.common.errors import Aborted, AlreadyExists, InvalidArgument
from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
from service.common.schema import ColumnType, Schema
from service.testing.mini_cluster import MiniCluster
from spark_jobs.jobs import backup as backup_job
from spark_jobs.jobs import restore as restore_job
from spark_jobs.jobs.backup import BACKUP_TS, DELETED, backup, last_backup, read_backup
from spark_jobs.jobs.restore import restore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(1200)]

# `s` is NOT NULL: a deleted key's row in the backup has no values, which the Delta table
# must take all the same.
SCHEMA = Schema.build(
    [("k", ColumnType.INT64), ("s", ColumnType.STRING, False), ("x", ColumnType.DOUBLE, True)],
    key="k",
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


def _keys(ids: list[int]) -> pa.Table:
    return pa.table({"k": pa.array(ids, pa.int64())})


def _table(client: SyncClient, name: str, at: int | None = None) -> list[dict[str, object]]:
    t = client.call("scan", name, snapshot=at) if at else client.call("scan", name)
    return sorted(t.to_pylist(), key=lambda r: r["k"])  # type: ignore[arg-type,return-value]


def _read(spark: SparkSession, dest: str, version: int) -> list[dict[str, object]]:
    df = read_backup(spark, dest, version)
    assert df.columns == list(SCHEMA.column_names)
    return sorted((r.asDict() for r in df.collect()), key=lambda r: r["k"])


def _commit(spark: SparkSession, dest: str, version: int) -> Any:
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, dest).history().where(f"version = {version}").first()


def test_a_chain_of_backups_reads_and_restores_as_the_table_at_each_backup(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    masters = cluster.master_addresses
    creds = cluster.credentials_dir()
    client.call("create_table", "orders", SCHEMA, PARTS, num_replicas=3)
    client.write("orders", _rows(list(range(1000)), "a"))
    dest = str(tmp_path / "orders_backup")

    v0, full, counts0 = backup(spark, client, masters, "orders", dest, credentials_dir=creds)
    assert (v0, full.kind, full.chain_timestamp) == (0, "full", full.snapshot_timestamp)
    assert counts0 == {"rows": 1000, "changed": 1000, "deleted": 0}
    t0 = full.snapshot_timestamp

    # First incremental: updates (20 among them), deletes (200 among them), inserts; key 10
    # updated, then deleted; key 300 deleted, then inserted again (a change, not a deletion).
    client.write("orders", _rows(list(range(0, 100, 10)), "b"), "update")
    client.write("orders", _keys([*range(1, 30, 3), 200, 300]), "delete")
    client.write("orders", _rows([*range(1000, 1020), 300], "c"), "insert")
    v1, inc1, counts1 = backup(spark, client, masters, "orders", dest, credentials_dir=creds)
    assert (v1, inc1.kind, inc1.previous_timestamp, inc1.chain_timestamp) == (
        1,
        "incremental",
        t0,
        t0,
    )
    # 9 updated (not 10), 20 + 1 inserted; 10 + 1 deleted (1..28 step 3, 200).
    assert counts1 == {"rows": 41, "changed": 30, "deleted": 11}
    t1 = inc1.snapshot_timestamp

    # Second incremental: key 200 comes back, key 20 is updated again, a key the first one
    # inserted is deleted, others change for the first time.
    client.write("orders", _rows([200, *range(2000, 2005)], "d"), "insert")
    client.write("orders", _rows([20, 30, 500], "e"), "update")
    client.write("orders", _keys([1000, 501]), "delete")
    v2, inc2, counts2 = backup(spark, client, masters, "orders", dest, credentials_dir=creds)
    assert (v2, inc2.previous_timestamp, inc2.chain_timestamp) == (2, t1, t0)
    assert counts2 == {"rows": 11, "changed": 9, "deleted": 2}
    t2 = inc2.snapshot_timestamp

    # An incremental backup is an append of the diff: no file of the chain is rewritten.
    for version, counts in ((v1, counts1), (v2, counts2)):
        commit = _commit(spark, dest, version)
        assert commit["operation"] == "WRITE"
        assert commit["operationParameters"]["mode"] == "Append"
        assert int(commit["operationMetrics"]["numOutputRows"]) == counts["rows"]
        assert "numRemovedFiles" not in commit["operationMetrics"]
    raw = spark.read.format("delta").option("versionAsOf", v2).load(dest)
    assert raw.columns == [BACKUP_TS, DELETED, *SCHEMA.column_names]
    assert raw.where(f"{BACKUP_TS} = {t2} AND {DELETED}").count() == 2

    # Every version read back is the table at that backup's timestamp.
    expected = {v0: _table(client, "orders", t0), v1: _table(client, "orders", t1)}
    expected[v2] = _table(client, "orders", t2)
    assert len({len(rows) for rows in expected.values()}) == 3  # the chain does change
    for version, rows in expected.items():
        assert _read(spark, dest, version) == rows, version
    assert last_backup(spark, dest, 0)[1].snapshot_timestamp == t0  # type: ignore[index]

    # A second full backup starts a new chain (an overwrite) and the new chain goes on from it;
    # the versions before it still read and restore as they did.
    client.write("orders", _rows([600], "f"), "update")
    v3, full2, _ = backup(spark, client, masters, "orders", dest, credentials_dir=creds, full=True)
    assert (v3, full2.kind, full2.chain_timestamp) == (3, "full", full2.snapshot_timestamp)
    assert _commit(spark, dest, v3)["operationParameters"]["mode"] == "Overwrite"
    client.write("orders", _keys([600, 601]), "delete")
    client.write("orders", _rows([601], "g"), "insert")
    v4, inc4, counts4 = backup(spark, client, masters, "orders", dest, credentials_dir=creds)
    assert (v4, inc4.chain_timestamp, counts4["deleted"]) == (4, full2.snapshot_timestamp, 1)
    assert _read(spark, dest, v3) == _table(client, "orders", full2.snapshot_timestamp)
    assert _read(spark, dest, v4) == _table(client, "orders", inc4.snapshot_timestamp)
    assert _read(spark, dest, v1) == expected[v1]

    made, v, info, rows = restore(
        spark, client, masters, dest, version=v1, table="orders_v1", credentials_dir=creds
    )
    assert (made, v, info.snapshot_timestamp) == ("orders_v1", v1, t1)
    assert _table(client, "orders_v1") == expected[v1]
    assert rows == len(expected[v1])
    handle = client.call("open_table", "orders_v1")
    assert handle.schema.column_names == SCHEMA.column_names
    assert not handle.schema.column("s").nullable
    assert handle.partition_schema.hash == PARTS.hash and handle.num_replicas == 3

    with pytest.raises(AlreadyExists):
        restore(spark, client, masters, dest, table="orders_v1", credentials_dir=creds)
    with pytest.raises(InvalidArgument, match="holds backups of table"):
        backup(spark, client, masters, "orders_v1", dest, credentials_dir=creds)
    with pytest.raises(InvalidArgument, match="holds backups of table"):
        backup(spark, client, masters, "orders_v1", dest, credentials_dir=creds, full=True)
    assert last_backup(spark, dest)[0] == v4  # type: ignore[index]


def _old_format_info(table: str) -> str:
    """A commit's metadata as the MERGE-era backup job wrote it (format 1, no chain start)."""
    return json.dumps(
        {
            "tessera_backup": 1,
            "table": table,
            "kind": "full",
            "snapshot_timestamp": 1,
            "previous_timestamp": 0,
            "schema": "",
            "partition_schema": "",
            "schema_version": 0,
            "num_replicas": 1,
        }
    )


def test_without_the_local_log_reader_spark_reads_the_same_chain(
    spark: SparkSession,
    cluster: MiniCluster,
    client: SyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a backup reads of its Delta table from the commit files (the previous backup, the
    one just written, its deletions) comes from Spark where the log is not readable here (a
    table that is not local): the same versions, metadata and counts."""
    monkeypatch.setattr(backup_job.delta_log, "commit", lambda table, version=None: None)
    masters = cluster.master_addresses
    creds = cluster.credentials_dir()
    client.call("create_table", "spark_read", SCHEMA, PARTS, num_replicas=3)
    client.write("spark_read", _rows(list(range(100)), "a"))
    dest = str(tmp_path / "spark_read_backup")
    v0, _, counts0 = backup(spark, client, masters, "spark_read", dest, credentials_dir=creds)
    assert (v0, counts0) == (0, {"rows": 100, "changed": 100, "deleted": 0})
    client.write("spark_read", _rows([1, 2, 200], "b"), "upsert")
    client.write("spark_read", _keys([3, 4]), "delete")
    v1, inc, counts1 = backup(spark, client, masters, "spark_read", dest, credentials_dir=creds)
    assert (v1, inc.kind, counts1) == (1, "incremental", {"rows": 5, "changed": 3, "deleted": 2})
    found = last_backup(spark, dest)
    assert found is not None and found[0] == 1 and found[1] == inc
    assert _read(spark, dest, 1) == _table(client, "spark_read", inc.snapshot_timestamp)


def test_of_two_incrementals_begun_from_one_backup_only_the_first_lands(
    spark: SparkSession,
    cluster: MiniCluster,
    client: SyncClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two backups into one path at once (an overlapping cron run): both start from backup 0;
    the one that commits second must not add a second diff of an overlapping span to the
    chain. Here the second run is made to see backup 0 as the newest, as it did when it began
    before the first one committed; it is refused and writes nothing."""
    masters = cluster.master_addresses
    creds = cluster.credentials_dir()
    client.call("create_table", "raced", SCHEMA, PARTS, num_replicas=3)
    client.write("raced", _rows(list(range(50)), "a"))
    dest = str(tmp_path / "raced_backup")
    backup(spark, client, masters, "raced", dest, credentials_dir=creds)
    began = last_backup(spark, dest)
    client.write("raced", _rows([1, 2], "b"), "upsert")
    v1, first, _ = backup(spark, client, masters, "raced", dest, credentials_dir=creds)
    assert v1 == 1
    client.write("raced", _rows([3], "c"), "upsert")
    real = backup_job.last_backup
    calls: list[int | None] = []

    def as_when_it_began(spark_: Any, path: str, version: int | None = None) -> Any:
        calls.append(version)
        return began if len(calls) == 1 else real(spark_, path, version)

    monkeypatch.setattr(backup_job, "last_backup", as_when_it_began)
    with pytest.raises(Aborted, match="committed first"):
        backup(spark, client, masters, "raced", dest, credentials_dir=creds)
    monkeypatch.undo()
    found = last_backup(spark, dest)
    assert found is not None and found[0] == 1 and found[1] == first
    assert _read(spark, dest, 1) == _table(client, "raced", first.snapshot_timestamp)
    # The chain goes on from backup 1 as if the raced run had never been.
    v2, second, counts = backup(spark, client, masters, "raced", dest, credentials_dir=creds)
    assert (v2, second.previous_timestamp, counts["changed"]) == (
        2,
        first.snapshot_timestamp,
        1,
    )
    assert _read(spark, dest, 2) == _table(client, "raced")


def test_an_old_format_chain_or_a_delta_table_that_is_no_backup_is_refused(
    spark: SparkSession, cluster: MiniCluster, client: SyncClient, tmp_path: Path
) -> None:
    masters = cluster.master_addresses
    creds = cluster.credentials_dir()
    client.call("create_table", "legacy", SCHEMA, PartitionSchema(), num_replicas=1)
    client.write("legacy", _rows(list(range(20)), "a"))
    rows = spark.createDataFrame(
        [(i, f"a{i}", None) for i in range(20)], "k long, s string, x double"
    )

    old = str(tmp_path / "old")
    rows.write.format("delta").option("userMetadata", _old_format_info("legacy")).save(old)
    for call in (
        lambda: backup(spark, client, masters, "legacy", old, credentials_dir=creds),
        lambda: read_backup(spark, old),
        lambda: restore(spark, client, masters, old, table="legacy2", credentials_dir=creds),
    ):
        with pytest.raises(InvalidArgument, match=r"format 1.*--full"):
            call()
    assert "legacy2" not in {t.name for t in client.call("list_tables")}
    assert _commit(spark, old, 0) is not None and _commit(spark, old, 1) is None
    # --full starts a new chain over it.
    v, info, _ = backup(spark, client, masters, "legacy", old, credentials_dir=creds, full=True)
    assert (v, info.kind) == (1, "full")
    assert _read(spark, old, v) == _table(client, "legacy", info.snapshot_timestamp)

    other = str(tmp_path / "not_a_backup")
    rows.write.format("delta").save(other)
    for full in (False, True):
        with pytest.raises(InvalidArgument, match="not a Tessera backup"):
            backup(spark, client, masters, "legacy", other, credentials_dir=creds, full=full)
    with pytest.raises(InvalidArgument, match="not a Tessera backup"):
        read_backup(spark, other)
    assert _commit(spark, other, 1) is None


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
    assert ": 50 rows -> " in capsys.readouterr().out.strip().splitlines()[-1]
    client.write("small", _rows([1, 2], "y"), "update")
    client.write("small", _keys([3]), "delete")
    assert backup_job.main(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("backup: small incremental at ") and "version 1" in out[-1]
    assert ": 3 rows (2 changed, 1 deleted) -> " in out[-1]
    restore_args = ["--masters", ",".join(cluster.master_addresses), "--source", dest]
    restore_args += ["--table", "small_restored"] + (["--credentials", creds] if creds else [])
    assert restore_job.main(restore_args) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("restore: small_restored from ") and ": 49 rows in " in last
    assert _table(client, "small_restored") == _table(client, "small")
