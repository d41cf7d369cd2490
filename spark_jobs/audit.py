"""Delta audit tables of the catalog (database `tessera_audit`) and of job findings.

Theory of operation
-------------------
`write_snapshot` appends one `Inventory` to one Delta table per kind of row: `tables`,
`tablets`, `replicas` (catalog configs), `hosted_replicas` (tablet-server listings),
`tservers`, `masters`, plus one row in `snapshots` that names the snapshot. Every row is stamped
with the snapshot id, the time it was taken, the master leader's term and the catalog's
committed index (and the snapshot's own row, like every job's findings, records who ran it:
the cluster identity of its credentials and the OS user), so the history of the catalog is a
query away:

    SELECT * FROM tessera_audit.tables VERSION AS OF 3
    SELECT * FROM tessera_audit.tablets TIMESTAMP AS OF '2026-11-22 10:00:00'
    DESCRIBE HISTORY tessera_audit.replicas

(more in docs/audit_queries.md). Appends are idempotent: each carries Delta's `txnAppId`
(the audit table and the snapshot id) and `txnVersion` 1. Delta skips a write whose version it
has already committed for that app id, so a job retried with the same `--snapshot-id` after a
failure half-way through appends each table exactly once.

The tables live in the Spark SQL catalog (a Hive metastore kept on disk, see
conf/spark-defaults.conf), so a later session or a SQL shell finds them by name.
`read_snapshot` turns a saved snapshot back into an `Inventory`: every job can run offline
against history with `--snapshot ID|latest`.
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
from spark_jobs.inventory import Inventory, SnapshotStamp
from spark_jobs.reconcile import Finding

__all__ = [
    "DATABASE",
    "RunBy",
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


def _append(spark: Any, table: pa.Table, name: str, snapshot_id: str) -> None:
    """Append once per (table, snapshot id): Delta skips a txnAppId's version it has seen."""
    df = spark.createDataFrame(table)
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", f"{DATABASE}.{name}.{snapshot_id}")
        .option("txnVersion", "1")
        .option("mergeSchema", "true")  # tables written before a column was added
        .saveAsTable(f"{DATABASE}.{name}")
    )


def write_snapshot(spark: Any, inv: Inventory, run_by: RunBy | None = None) -> dict[str, int]:
    """Append `inv` to the audit tables (idempotent); rows written per table. The snapshot's
    row records who took it (`run_by`)."""
    who = run_by or RunBy.of(None)
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    sid = inv.stamp.snapshot_id
    counts: dict[str, int] = {}
    for kind, row_type in Inventory.KINDS.items():
        rows = inv.rows(kind)
        _append(spark, _arrow_rows(row_type, inv.stamp, rows), kind, sid)
        counts[kind] = len(rows)
    summary = pa.Table.from_pylist(
        [
            {
                "snapshot_id": inv.stamp.snapshot_id,
                "taken_at": inv.stamp.taken_at,
                "master_term": inv.stamp.master_term,
                "committed_index": inv.stamp.committed_index,
                **{f"num_{k}": v for k, v in counts.items()},
                "run_by": who.identity,
                "os_user": who.os_user,
            }
        ],
        schema=pa.schema(
            _STAMP
            + [pa.field(f"num_{k}", pa.int64()) for k in counts]
            + [pa.field("run_by", pa.string()), pa.field("os_user", pa.string())]
        ),
    )
    _append(spark, summary, "snapshots", sid)
    return counts


def _tables(spark: Any) -> set[str]:
    return {r.tableName for r in spark.sql(f"SHOW TABLES IN {DATABASE}").collect()}


def read_snapshot(spark: Any, snapshot_id: str = "latest") -> Inventory:
    """The inventory saved as `snapshot_id` ("latest": the newest one)."""
    if not spark.catalog.databaseExists(DATABASE) or "snapshots" not in _tables(spark):
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
        df = spark.table(f"{DATABASE}.{kind}").filter(f"snapshot_id = '{stamp.snapshot_id}'")
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
    """Append a run's findings to tessera_audit.findings (once per run id), with who ran it."""
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    table = findings_table(run_id, at, findings, outcomes, run_by)
    df = spark.createDataFrame(table)
    (
        df.write.format("delta")
        .mode("append")
        .option("txnAppId", f"{DATABASE}.findings.{run_id}")
        .option("txnVersion", "1")
        .option("mergeSchema", "true")
        .saveAsTable(f"{DATABASE}.findings")
    )
