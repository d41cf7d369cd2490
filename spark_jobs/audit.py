"""Delta audit tables of the catalog (database `tessera_audit`) and of job findings.

Theory of operation
-------------------
One `Inventory` (the catalog and every server's listing at one moment) is one snapshot. For
each kind of row (`tables`, `tablets`, `replicas` (catalog configs), `hosted_replicas`
(tablet-server listings), `tservers`, `masters`) `write_snapshot` keeps two Delta tables:

* `<kind>`: the catalog as of the latest snapshot, made so by one MERGE by key (`KEYS`) per
  snapshot that changed it (changed rows updated, new ones inserted, vanished ones deleted;
  no commit at all when nothing changed). So each Delta version is exactly one snapshot,
  `VERSION AS OF` / `TIMESTAMP AS OF` give one snapshot's rows, and with the change data feed
  on, `table_changes('tessera_audit.tables', v1, v2)` is the catalog's diff between two
  snapshots. A row's stamp columns name the snapshot that last changed it.
* `<kind>_history`: every snapshot's rows, appended, for questions "over time".

Every row is stamped with the snapshot id, the time it was taken, the master leader's term and
the catalog's committed index. Then one row goes into `snapshots`: the commit point (a
snapshot id found there was written whole), with each current table's Delta version after the
snapshot and who took it (the cluster identity of its credentials and the OS user; job
findings record the same):

    SELECT * FROM tessera_audit.tables VERSION AS OF 3
    SELECT * FROM tessera_audit.tablets TIMESTAMP AS OF '2026-11-22 10:00:00'
    SELECT * FROM table_changes('tessera_audit.replicas', 1, 2)

(more in docs/audit_queries.md). A snapshot id already in `snapshots`, or a catalog at the
latest snapshot's master term and committed index, writes nothing. A retry after a failure
half-way through appends nothing twice (history appends carry Delta's `txnAppId`, the table
and snapshot id, with `txnVersion` 1, and Delta skips a version it has committed for that app
id) and the MERGE converges on the same rows.

The tables are Delta tables under the warehouse (`<warehouse>/tessera_audit.db/<table>`) that
every session registers by name itself (spark_jobs/catalog.py: no metastore shared between
processes unless one is configured), so a later session finds them by name. Jobs running at
the same time meet only in Delta's optimistic concurrency: a write that loses a race with
another writer is retried whole, which the idempotence above makes safe.
`read_snapshot` turns a saved snapshot back into an `Inventory` (from the history tables):
every job can run offline against history with `--snapshot ID|latest`.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import typing
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import pyarrow as pa

from service.common.errors import NotFound
from service.common.tls import Credentials
from spark_jobs.catalog import (
    append,
    ensure_database,
    register,
    register_tables,
    retry_on_conflict,
    table_path,
)
from spark_jobs.inventory import Inventory, SnapshotStamp
from spark_jobs.reconcile import Finding

__all__ = [
    "AUDIT_TABLES",
    "DATABASE",
    "KEYS",
    "RunBy",
    "SnapshotWrite",
    "findings_table",
    "read_snapshot",
    "write_findings",
    "write_snapshot",
]

DATABASE = "tessera_audit"
_STAMP = [
    pa.field("snapshot_id", pa.string()),
    pa.field("taken_at", pa.timestamp("us", tz="UTC")),
    pa.field("master_term", pa.int64()),
    pa.field("committed_index", pa.int64()),
]
_ARROW = {"str": pa.string(), "int": pa.int64(), "bool": pa.bool_(), "bytes": pa.binary()}


def _arrow_schema(row_type: type) -> pa.Schema:
    return pa.schema(_STAMP + [pa.field(f.name, _ARROW[str(f.type)]) for f in fields(row_type)])


def _arrow_rows(row_type: type, stamp: SnapshotStamp, rows: Sequence[Any]) -> pa.Table:
    schema = _arrow_schema(row_type)
    cols: dict[str, list[Any]] = {f.name: [] for f in fields(row_type)}
    for r in rows:
        for k, v in asdict(r).items():
            cols[k].append(v)
    n = len(rows)
    stamped = {
        "snapshot_id": [stamp.snapshot_id] * n,
        "taken_at": [stamp.taken_at] * n,
        "master_term": [stamp.master_term] * n,
        "committed_index": [stamp.committed_index] * n,
        **cols,
    }
    return pa.Table.from_pydict(stamped, schema=schema)


def _frame(spark: Any, table: pa.Table) -> Any:
    """`table` as a DataFrame, its schema given explicitly: Spark Connect cannot infer one
    from an empty table (an inventory with no hosted replicas, say)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return spark.createDataFrame(table, schema=from_arrow_schema(table.schema))


def _append(spark: Any, table: pa.Table, name: str, snapshot_id: str) -> None:
    """Append once per (table, snapshot id): Delta skips a txnAppId's version it has seen."""
    df = _frame(spark, table)
    writer = (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", f"{DATABASE}.{name}.{snapshot_id}")
        .option("txnVersion", "1")
        .option("mergeSchema", "true")  # tables written before a column was added
    )
    append(spark, writer, DATABASE, name)


KEYS: dict[str, tuple[str, ...]] = {
    "tables": ("table_id",),
    "tablets": ("tablet_id",),
    "replicas": ("tablet_id", "ts_uuid"),
    "hosted_replicas": ("ts_uuid", "tablet_id"),
    "tservers": ("ts_uuid",),
    "masters": ("uuid",),
}
"""The key of each current audit table's rows (what MERGE matches on)."""


@dataclass(frozen=True)
class SnapshotWrite:
    """What `write_snapshot` did: "written", "unchanged" (the catalog is at the latest
    snapshot's term and committed index: nothing written) or "exists" (this snapshot id was
    written before: nothing written); rows per table; each current table's Delta version."""

    status: str
    counts: dict[str, int]
    versions: dict[str, int]
    previous: str = ""
    """The snapshot found unchanged or already there."""


def _latest_version(spark: Any, name: str) -> int:
    return int(spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()[0].version)


def _count(spark: Any, query: str) -> int:
    return int(spark.sql(f"SELECT count(*) AS n FROM ({query})").collect()[0].n)


def _merge_current(spark: Any, table: pa.Table, kind: str) -> int:
    """Make `tessera_audit.<kind>` hold exactly `table`'s rows: one Delta commit (a MERGE by
    key that updates changed rows, inserts new ones and deletes vanished ones), or none when
    nothing changed, so its versions are snapshots and its change data feed is the catalog's
    diff. The stamp columns of a row are the snapshot that last changed it. Returns the
    table's Delta version afterwards."""
    name = f"{DATABASE}.{kind}"
    view = f"tessera_audit_src_{kind}"
    _frame(spark, table).createOrReplaceTempView(view)
    if kind not in _tables(spark):
        # Created at its path, then named: in the in-memory catalog a CREATE TABLE of a managed
        # table is refused once another process has created its directory, while a path is
        # Delta's to arbitrate (it fails DELTA_PATH_EXISTS, and write_snapshot tries again).
        path = table_path(spark, DATABASE, kind)
        spark.sql(
            f"CREATE TABLE delta.`{path}` USING delta "
            "TBLPROPERTIES (delta.enableChangeDataFeed = true) "
            f"AS SELECT * FROM {view}"
        )
        register(spark, DATABASE, kind, path)
        return _latest_version(spark, name)
    stamp = {f.name for f in _STAMP}
    data = [c for c in table.column_names if c not in stamp]
    keys = KEYS[kind]
    cols = ", ".join(data)
    key_cols = ", ".join(keys)
    changed = _count(spark, f"SELECT {cols} FROM {view} EXCEPT SELECT {cols} FROM {name}") + _count(
        spark, f"SELECT {key_cols} FROM {name} EXCEPT SELECT {key_cols} FROM {view}"
    )
    if changed:
        on = " AND ".join(f"t.{k} = s.{k}" for k in keys)
        same = " AND ".join(f"t.{c} <=> s.{c}" for c in data)
        spark.sql(
            f"MERGE INTO {name} t USING {view} s ON {on} "
            f"WHEN MATCHED AND NOT ({same}) THEN UPDATE SET * "
            "WHEN NOT MATCHED THEN INSERT * "
            "WHEN NOT MATCHED BY SOURCE THEN DELETE"
        )
    return _latest_version(spark, name)


def write_snapshot(spark: Any, inv: Inventory, run_by: RunBy | None = None) -> SnapshotWrite:
    """Write `inv` (module docstring): append it to the `*_history` tables, MERGE it into the
    current tables, then record it in `snapshots` (the commit point: a snapshot id in
    `snapshots` was written whole). A snapshot id already there, or a catalog at the latest
    snapshot's master term and committed index, writes nothing. Retrying after a failure
    half-way appends nothing twice (history appends carry Delta's txnAppId) and the MERGE
    converges, so a write that loses a race with another writer (another job writing the same
    tables) is retried whole. `run_by` (who took it) goes in the `snapshots` row."""
    from spark_jobs.session import require_delta

    require_delta(spark, "an audit snapshot")
    return retry_on_conflict(lambda: _write_snapshot(spark, inv, run_by))


def _write_snapshot(spark: Any, inv: Inventory, run_by: RunBy | None) -> SnapshotWrite:
    who = run_by or RunBy.of(None)
    ensure_database(spark, DATABASE)
    sid = inv.stamp.snapshot_id
    counts = {kind: len(inv.rows(kind)) for kind in Inventory.KINDS}
    if "snapshots" in _tables(spark):
        snaps = spark.table(f"{DATABASE}.snapshots")
        if snaps.filter(snaps.snapshot_id == sid).limit(1).count():
            return SnapshotWrite("exists", counts, {}, sid)
        latest = snaps.orderBy(snaps.taken_at.desc()).limit(1).collect()
        if latest and (latest[0].master_term, latest[0].committed_index) == (
            inv.stamp.master_term,
            inv.stamp.committed_index,
        ):
            return SnapshotWrite("unchanged", counts, {}, latest[0].snapshot_id)
    versions: dict[str, int] = {}
    for kind, row_type in Inventory.KINDS.items():
        rows = _arrow_rows(row_type, inv.stamp, inv.rows(kind))
        _append(spark, rows, f"{kind}_history", sid)
        versions[kind] = _merge_current(spark, rows, kind)
    summary = pa.Table.from_pylist(
        [
            {
                "snapshot_id": inv.stamp.snapshot_id,
                "taken_at": inv.stamp.taken_at,
                "master_term": inv.stamp.master_term,
                "committed_index": inv.stamp.committed_index,
                **{f"num_{k}": v for k, v in counts.items()},
                **{f"{k}_version": v for k, v in versions.items()},
                "run_by": who.identity,
                "os_user": who.os_user,
            }
        ],
        schema=pa.schema(
            _STAMP
            + [pa.field(f"num_{k}", pa.int64()) for k in counts]
            + [pa.field(f"{k}_version", pa.int64()) for k in versions]
            + [pa.field("run_by", pa.string()), pa.field("os_user", pa.string())]
        ),
    )
    _append(spark, summary, "snapshots", sid)
    return SnapshotWrite("written", counts, versions)


AUDIT_TABLES = (
    *KEYS,
    *(f"{kind}_history" for kind in KEYS),
    "snapshots",
    "findings",
    "rebalance_plans",
)
"""Every table of `tessera_audit` the jobs write (what a Spark Connect session looks for)."""


def _tables(spark: Any) -> set[str]:
    """The audit tables, including those another process created since this session began."""
    register_tables(spark, DATABASE, AUDIT_TABLES)
    if not spark.catalog.databaseExists(DATABASE):
        return set()
    return {r.tableName for r in spark.sql(f"SHOW TABLES IN {DATABASE}").collect()}


def read_snapshot(spark: Any, snapshot_id: str = "latest") -> Inventory:
    """The inventory saved as `snapshot_id` ("latest": the newest one)."""
    if "snapshots" not in _tables(spark):
        raise NotFound(f"no audit snapshots: database {DATABASE} has no snapshots table yet")
    snaps = spark.table(f"{DATABASE}.snapshots")
    if snapshot_id == "latest":
        rows = snaps.orderBy(snaps.taken_at.desc()).limit(1).collect()
    else:
        rows = snaps.filter(snaps.snapshot_id == snapshot_id).collect()
    if not rows:
        raise NotFound(f"no audit snapshot {snapshot_id!r} in {DATABASE}.snapshots")
    s = rows[0]
    taken = s.taken_at if s.taken_at.tzinfo else s.taken_at.replace(tzinfo=dt.UTC)
    stamp = SnapshotStamp(s.snapshot_id, taken, s.master_term, s.committed_index)
    inv = Inventory(stamp)
    for kind, row_type in Inventory.KINDS.items():
        df = spark.table(f"{DATABASE}.{kind}_history").filter(
            f"snapshot_id = '{stamp.snapshot_id}'"
        )
        names = [f.name for f in fields(row_type)]
        table = df.select(*names).toArrow()
        rows_out = [row_type(**r) for r in table.to_pylist()]
        getattr(inv, "hosted" if kind == "hosted_replicas" else kind).extend(rows_out)
    return inv


_FINDING_FIELDS = [f.name for f in fields(Finding)]


@dataclass(frozen=True)
class RunBy:
    """Who ran a job, as audit rows record it: the cluster identity its credentials bind
    ("admin 'ops'", or "insecure" without credentials) and the operating-system user."""

    identity: str
    os_user: str

    @classmethod
    def of(cls, credentials: Credentials | None) -> RunBy:
        try:
            os_user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry (some containers)
            os_user = f"uid {os.getuid()}"
        who = str(credentials.identity) if credentials is not None else "insecure"
        return cls(who, os_user)


def findings_table(
    run_id: str,
    at: dt.datetime,
    findings: Sequence[Finding],
    outcomes: Sequence[str],
    run_by: RunBy | None = None,
) -> pa.Table:
    who = run_by or RunBy.of(None)
    hints = typing.get_type_hints(Finding)
    schema = pa.schema(
        [pa.field("run_id", pa.string()), pa.field("at", pa.timestamp("us", tz="UTC"))]
        + [pa.field(n, _ARROW[hints[n].__name__]) for n in _FINDING_FIELDS]
        + [pa.field("outcome", pa.string())]
        + [pa.field("run_by", pa.string()), pa.field("os_user", pa.string())]
    )
    rows = [
        {
            "run_id": run_id,
            "at": at,
            **asdict(f),
            "outcome": o,
            "run_by": who.identity,
            "os_user": who.os_user,
        }
        for f, o in zip(findings, outcomes, strict=True)
    ]
    return pa.Table.from_pylist(rows, schema=schema)


def write_findings(
    spark: Any,
    run_id: str,
    at: dt.datetime,
    findings: Sequence[Finding],
    outcomes: Sequence[str],
    run_by: RunBy | None = None,
) -> None:
    """Append a run's findings to tessera_audit.findings (once per run id), with who ran it.
    A run that found nothing writes nothing (no empty Delta commit per run)."""
    if not findings:
        return
    from spark_jobs.session import require_delta

    require_delta(spark, "recording findings in tessera_audit.findings")
    table = findings_table(run_id, at, findings, outcomes, run_by)
    writer = (
        _frame(spark, table)
        .write.format("delta")
        .mode("append")
        .option("txnAppId", f"{DATABASE}.findings.{run_id}")
        .option("txnVersion", "1")
        .option("mergeSchema", "true")
    )
    retry_on_conflict(lambda: append(spark, writer, DATABASE, "findings"))
