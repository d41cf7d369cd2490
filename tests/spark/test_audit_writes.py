"""What an audit snapshot commits: only what changed (spark_jobs/audit.py).

Synthetic inventories (no cluster) written into `tessera_audit`, which the module empties before
and after its tests, since the session's warehouse is shared with tests/spark/test_jobs.py. A
snapshot in which one tablet changed makes one new version of `tablets` whose change data feed
is that row's update, and none of the other current tables; a vanished and a new tablet are a
delete and an insert; a kind with no rows any more is emptied by one commit and appends nothing
to its history; an unchanged catalog and a repeated snapshot id write nothing at all.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pytest

from spark_jobs import delta_log
from spark_jobs.audit import DATABASE, KEYS, read_snapshot, write_snapshot
from spark_jobs.catalog import table_path
from spark_jobs.inventory import (
    HostedRow,
    Inventory,
    MasterRow,
    ReplicaRow,
    SnapshotStamp,
    TableRow,
    TabletRow,
    TServerRow,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

SERVERS = ["ts-a", "ts-b", "ts-c"]
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def drop_audit(spark: SparkSession) -> None:
    """No `tessera_audit` at all: its names, its directory, Delta's cached logs of it."""
    where = urlparse(table_path(spark, DATABASE, "x")).path.rsplit("/", 1)[0]
    spark.sql(f"DROP DATABASE IF EXISTS {DATABASE} CASCADE")
    shutil.rmtree(where, ignore_errors=True)
    jvm = getattr(spark, "_jvm", None)
    assert jvm is not None
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture(scope="module")
def audit(spark: SparkSession) -> Iterator[SparkSession]:
    drop_audit(spark)
    try:
        yield spark
    finally:
        drop_audit(spark)


def tablet(tablet_id: str, table_id: str, schema_version: int = 2) -> TabletRow:
    return TabletRow(tablet_id, table_id, "RUNNING", b"", b"", "ts-a", 5, schema_version, "", 0)


def inventory(snapshot_id: str, index: int, tablet_ids: list[str]) -> Inventory:
    """Two tables; `tablet_ids` in the first, one in the second; 3 replicas each, listed."""
    inv = Inventory(SnapshotStamp(snapshot_id, T0 + dt.timedelta(minutes=index), 7, index))
    inv.tables = [
        TableRow("tb-1", "one", "RUNNING", 2, 3, "me", 0, 0),
        TableRow("tb-2", "two", "RUNNING", 2, 3, "me", 0, 0),
    ]
    inv.tablets = [tablet(t, "tb-1") for t in tablet_ids] + [tablet("t-two", "tb-2")]
    for t in inv.tablets:
        for u in SERVERS:
            inv.replicas.append(ReplicaRow(t.tablet_id, t.table_id, u, "VOTER", u == "ts-a", ""))
            inv.hosted.append(
                HostedRow(
                    u, t.tablet_id, t.table_id, "x", "READY", "RUNNING",
                    "LEADER" if u == "ts-a" else "FOLLOWER", 1, "ts-a", 2, 5, True, 0, 0, "",
                )
            )  # fmt: skip
    inv.tservers = [TServerRow(u, f"{u}:7050", True, 0, 0, 0, True, "") for u in SERVERS]
    inv.masters = [MasterRow("m-1", "m-1:7051", "LEADER", 7, 100, "")]
    return inv


def later(inv: Inventory, snapshot_id: str, **changes: object) -> Inventory:
    """`inv` taken again at a later index, with `changes` to its rows."""
    stamp = dataclasses.replace(
        inv.stamp,
        snapshot_id=snapshot_id,
        taken_at=inv.stamp.taken_at + dt.timedelta(minutes=1),
        committed_index=inv.stamp.committed_index + 1,
    )
    return dataclasses.replace(inv, stamp=stamp, **changes)  # type: ignore[arg-type]


def versions(spark: SparkSession) -> dict[str, int]:
    """The latest Delta version of every audit table the snapshots write."""
    names = [*KEYS, *(f"{k}_history" for k in KEYS), "snapshots"]
    return {
        n: int(spark.sql(f"DESCRIBE HISTORY {DATABASE}.{n} LIMIT 1").collect()[0].version)
        for n in names
    }


def changes(spark: SparkSession, kind: str, version: int, *cols: str) -> list[tuple[object, ...]]:
    rows = spark.sql(
        f"SELECT _change_type, {', '.join(cols)} "
        f"FROM table_changes('{DATABASE}.{kind}', {version}, {version})"
    ).collect()
    return sorted(tuple(r) for r in rows)


def test_a_snapshot_commits_only_what_changed(audit: SparkSession) -> None:
    spark = audit
    first = inventory("s1", 10, ["t-1", "t-2", "t-3"])
    assert write_snapshot(spark, first).status == "written"
    v1 = versions(spark)
    assert set(v1.values()) == {0}  # each table created by the first snapshot

    # One tablet changed (its replicas reported a new schema): one commit on `tablets`, the
    # history appends and the `snapshots` row; none on any other current table.
    bumped = [tablet("t-2", "tb-1", schema_version=3) if t.tablet_id == "t-2" else t
              for t in first.tablets]  # fmt: skip
    second = later(first, "s2", tablets=bumped)
    done = write_snapshot(spark, second)
    v2 = versions(spark)
    assert done.status == "written"
    assert v2 == {n: v + 1 if n == "tablets" or n.endswith(("_history", "snapshots")) else v
                  for n, v in v1.items()}  # fmt: skip
    assert done.versions == {k: v2[k] for k in KEYS}
    assert changes(spark, "tablets", v2["tablets"], "tablet_id", "reported_schema_version",
                   "snapshot_id") == [
        ("update_postimage", "t-2", 3, "s2"),
        ("update_preimage", "t-2", 2, "s1"),
    ]  # fmt: skip
    current = {r.tablet_id: r.snapshot_id for r in spark.table(f"{DATABASE}.tablets").collect()}
    assert current == {"t-1": "s1", "t-2": "s2", "t-3": "s1", "t-two": "s1"}

    # The same catalog again (same term and index, a new id): nothing written anywhere.
    again = dataclasses.replace(second, stamp=dataclasses.replace(second.stamp, snapshot_id="s3"))
    done = write_snapshot(spark, again)
    assert (done.status, done.previous) == ("unchanged", "s2")
    assert write_snapshot(spark, second).status == "exists"
    assert versions(spark) == v2

    # A tablet gone and a new one: a delete and an insert, on tablets, replicas and listings.
    third = inventory("s4", 12, ["t-1", "t-2", "t-4"])
    third.tablets = [t if t.tablet_id != "t-2" else bumped[1] for t in third.tablets]
    assert bumped[1].tablet_id == "t-2"  # as in s2: unchanged
    done = write_snapshot(spark, third)
    v4 = versions(spark)
    assert {k: v4[k] - v2[k] for k in KEYS} == {
        "tables": 0, "tablets": 1, "replicas": 1, "hosted_replicas": 1, "tservers": 0, "masters": 0
    }  # fmt: skip
    assert changes(spark, "tablets", v4["tablets"], "tablet_id") == [
        ("delete", "t-3"),
        ("insert", "t-4"),
    ]
    assert changes(spark, "replicas", v4["replicas"], "tablet_id", "ts_uuid") == sorted(
        [("delete", "t-3", u) for u in SERVERS] + [("insert", "t-4", u) for u in SERVERS]
    )
    assert sorted(read_snapshot(spark, "s4").tablets, key=lambda t: t.tablet_id) == sorted(
        third.tablets, key=lambda t: t.tablet_id
    )

    # No server lists anything any more: `hosted_replicas` emptied in one commit, its history
    # appended nothing (there was nothing to append).
    fourth = later(third, "s5", hosted=[])
    write_snapshot(spark, fourth)
    v5 = versions(spark)
    assert v5["hosted_replicas"] == v4["hosted_replicas"] + 1
    assert v5["hosted_replicas_history"] == v4["hosted_replicas_history"]
    assert spark.table(f"{DATABASE}.hosted_replicas").count() == 0
    deleted = changes(spark, "hosted_replicas", v5["hosted_replicas"], "tablet_id")
    assert {c for c, _ in deleted} == {"delete"} and len(deleted) == 3 * len(third.tablets)
    assert read_snapshot(spark, "s5").hosted == []


def test_the_log_reader_sees_what_spark_sees(spark: SparkSession, tmp_path: Path) -> None:
    """spark_jobs/delta_log.py against tables Spark wrote: past a checkpoint (every 10th
    commit), every version's files and rows are Spark's; a table with deletion vectors it
    leaves to Spark."""
    import pyarrow.parquet as pq

    path = tmp_path / "t"
    for i in range(12):
        mode = "overwrite" if i in (0, 6) else "append"  # an overwrite removes files too
        spark.range(i * 10, i * 10 + 5).write.format("delta").mode(mode).save(str(path))
    assert any(p.name.endswith(".checkpoint.parquet") for p in (path / "_delta_log").iterdir())
    assert delta_log.latest_version(path) == 11
    for version in (3, 9, 11):
        snap = delta_log.snapshot(path, version)
        assert snap is not None and snap.version == version
        frame = spark.read.format("delta").option("versionAsOf", version).load(str(path))
        theirs = {urlparse(f).path for f in frame.inputFiles()}
        assert set(snap.files) == theirs
        mine = sorted(pq.read_table(list(snap.files)).column("id").to_pylist())
        assert mine == sorted(r.id for r in frame.collect())
    dv = tmp_path / "dv"
    spark.range(100).write.format("delta").option("delta.enableDeletionVectors", "true").save(
        str(dv)
    )
    spark.sql(f"DELETE FROM delta.`{dv}` WHERE id < 10")
    assert delta_log.latest_version(dv) == 1
    assert delta_log.snapshot(dv) is None
