"""What an audit snapshot commits: only what changed (spark_jobs/audit.py).

Synthetic inventories (no cluster) written into `tessera_audit`, which the module empties before
and after its tests, since the session's warehouse is shared with tests/spark/test_jobs.py. A
snapshot in which one tablet changed makes one new version of `tablets` whose change data feed
is that row's update, and none of the other current tables; a vanished and a new tablet are a
delete and an insert; a kind with no rows any more is emptied by one commit and appends nothing
to its history; an unchanged catalog and a repeated snapshot id write nothing at all. All of
it with delta-rs (the local warehouse) and with Spark (the path for any other), and delta-rs
carrying on tables Spark made; delta-rs's commits racing another writer's commit once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import pyarrow as pa
import pytest

from spark_jobs import audit as audit_module
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


@pytest.fixture
def audit(spark: SparkSession) -> Iterator[SparkSession]:
    drop_audit(spark)
    try:
        yield spark
    finally:
        drop_audit(spark)


def spark_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every audit commit by Spark, as for a warehouse that is not local (audit._rs_dir)."""
    monkeypatch.setattr(audit_module, "_rs_dir", lambda spark: None)


def engines(spark: SparkSession, name: str) -> dict[int, str]:
    """Which engine made each version of audit table `name` ("delta-rs" or "Spark")."""
    rows = spark.sql(f"DESCRIBE HISTORY {DATABASE}.{name}").collect()
    return {
        int(r.version): "delta-rs" if str(r.engineInfo).startswith("delta-rs") else "Spark"
        for r in rows
    }


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


@pytest.mark.parametrize("engine", ["delta-rs", "Spark"])
def test_a_snapshot_commits_only_what_changed(
    audit: SparkSession, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spark = audit
    if engine == "Spark":
        spark_writes(monkeypatch)
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
    # Every commit by the engine this warehouse calls for.
    for name in v5:
        assert set(engines(spark, name).values()) == {engine}, name


def test_delta_rs_carries_on_tables_spark_made(
    audit: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A warehouse whose audit tables Spark made (before delta-rs wrote them, or a snapshot
    taken through the fallback): delta-rs's MERGE into them gives Spark the exact change
    feed, and the appends of a snapshot are made once whichever engine retries them (both
    honour Delta's txnAppId)."""
    spark = audit
    first = inventory("s1", 10, ["t-1", "t-2"])
    with monkeypatch.context() as m:
        spark_writes(m)
        assert write_snapshot(spark, first).status == "written"
    v1 = versions(spark)
    second = later(first, "s2", tablets=[tablet("t-1", "tb-1", 9), tablet("t-3", "tb-1")])
    assert write_snapshot(spark, second).status == "written"
    v2 = versions(spark)
    assert engines(spark, "tablets") == {0: "Spark", 1: "delta-rs"}
    assert changes(spark, "tablets", v2["tablets"], "tablet_id", "reported_schema_version") == [
        ("delete", "t-2", 2),
        ("delete", "t-two", 2),
        ("insert", "t-3", 2),
        ("update_postimage", "t-1", 9),
        ("update_preimage", "t-1", 2),
    ]
    assert {r.tablet_id for r in spark.table(f"{DATABASE}.tablets").collect()} == {"t-1", "t-3"}
    assert {
        r.tablet_id
        for r in spark.sql(
            f"SELECT tablet_id FROM {DATABASE}.tablets VERSION AS OF {v1['tablets']}"
        ).collect()
    } == {"t-1", "t-2", "t-two"}
    # The history appends of s2 again, by either engine: Delta skips them.
    rows = audit_module._arrow_rows(TabletRow, second.stamp, second.tablets)
    local = audit_module._rs_dir(spark)
    assert local is not None  # the tests' warehouse is local: delta-rs writes
    audit_module._append(spark, rows, "tablets_history", "s2", local, named=True)
    audit_module._append(spark, rows, "tablets_history", "s2", None, named=True)  # by Spark
    assert versions(spark) == v2
    history = spark.sql(
        f"SELECT count(*) FROM {DATABASE}.tablets_history WHERE snapshot_id = 's2'"
    ).collect()[0][0]
    assert history == 2


def test_delta_rs_commits_that_lose_a_race_look_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer commits between delta-rs's look at a table and its commit: an append
    whose app id that writer committed appends nothing, and a MERGE taken against the older
    version commits nothing (the caller compares again)."""
    import deltalake

    where = tmp_path / "history"
    one = pa.table({"k": ["a"], "v": [1]})
    audit_module._rs_append(where, one, "app-1")
    real = deltalake.write_deltalake
    raced: list[str] = []

    def racing(target: object, data: object, **kw: object) -> None:
        if not raced:  # the other writer, first: the same app id's append
            raced.append("app-2")
            real(str(where), one, mode="append", commit_properties=audit_module._rs_commit("app-2"))
        real(target, data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(deltalake, "write_deltalake", racing)
    audit_module._rs_append(where, one, "app-2")
    assert raced == ["app-2"]
    monkeypatch.undo()
    table = deltalake.DeltaTable(str(where))
    assert table.version() == 1 and table.to_pyarrow_table().num_rows == 2  # not 3
    audit_module._rs_append(where, one, "app-2")
    assert deltalake.DeltaTable(str(where)).version() == 1

    stamp = SnapshotStamp("s1", T0, 1, 1)
    rows = audit_module._arrow_rows(
        TServerRow, stamp, [TServerRow("ts-a", "a:1", True, 0, 0, 0, True, "")]
    )
    current = tmp_path / "tservers"
    audit_module._rs_create(current, rows, None, cdf=True)
    changed = audit_module._arrow_rows(
        TServerRow, stamp, [TServerRow("ts-a", "a:2", True, 0, 0, 0, True, "")]
    )
    diff = audit_module._diff(changed, rows, KEYS["tservers"])
    assert diff
    real(str(current), rows.slice(0, 0), mode="append")  # another writer's commit: version 1
    assert audit_module._rs_merge(current, changed, "tservers", diff, 0) is None
    assert deltalake.DeltaTable(str(current)).version() == 1
    assert audit_module._rs_merge(current, changed, "tservers", diff, 1) == 2
    got = deltalake.DeltaTable(str(current)).to_pyarrow_table().column("address").to_pylist()
    assert got == ["a:2"]


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
