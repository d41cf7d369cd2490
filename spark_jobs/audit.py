"""Delta audit tables of the catalog (database `tessera_audit`) and of job findings.

Theory of operation
-------------------
One `Inventory` (the catalog and every server's listing at one moment) is one snapshot. For
each kind of row (`tables`, `tablets`, `replicas` (catalog configs), `hosted_replicas`
(tablet-server listings), `tservers`, `masters`) `write_snapshot` keeps two Delta tables:

* `<kind>`: the catalog as of the latest snapshot, made so by at most one Delta commit per
  snapshot: none when nothing of that kind changed, else one MERGE by key (`KEYS`) whose
  source is only the rows that changed (updated), the new ones (inserted) and a marker per key
  that vanished (deleted: the key, every other column null). So each Delta version is exactly
  one snapshot, `VERSION AS OF` / `TIMESTAMP AS OF` give one snapshot's rows, and with the
  change data feed on, `table_changes('tessera_audit.tables', v1, v2)` is the catalog's diff
  between two snapshots. A row's stamp columns name the snapshot that last changed it.
* `<kind>_history`: every snapshot's rows, appended (one commit; none for a kind with no
  rows once the table exists), for questions "over time".

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
id) and the current tables converge (the retry finds what is left to change, if anything).

Why the diff is taken here, in Python: a snapshot is a few hundred thousand rows at most, and
nearly all of them are as they were last time. Letting Spark find the changes (a MERGE of the
whole snapshot, with two EXCEPT queries first to see whether there were any) cost a dozen
Spark jobs per table and a rewrite of all of it: minutes for a small catalog on a busy
two-core machine, and the driver out of memory at 100,000 tablets. Instead each current table
is read once into Arrow at a version pinned first (straight from its Parquet files when that
is safe: spark_jobs/delta_log.py, which also answers "which version is the newest?" without a
Spark job) and compared with the snapshot's rows by key with pyarrow (a join of the keys, then
column by column), which takes well under a second; only a table
that changed gets its MERGE, whose source is just the changed rows. A commit by another writer
between the read and the MERGE (the version after the MERGE is not the pinned one plus one)
makes the comparison stale, so it is made again. The kinds are written at the same time, one
thread each, large frames taking turns (`_WRITERS`, `_BULK`). Whether to write at all is one
query over `snapshots` (is this id there, and what is the latest row), so an unchanged catalog
costs about a second. `make bench-jobs` (`--audit-only`) measures the three cases.

Why delta-rs
------------
With the diff taken here, what was left of a snapshot's time was Spark's cost per Delta
commit: on this project's busy two-core machine a MERGE of 4 rows into a 300-row table with
the change data feed on took 12.3 s as a JVM's first and some 2.7 s each after (planning, the
Delta log, a few jobs), so a small catalog's six changed kinds cost ~12 s; and appending a
large catalog's ~700,000 history rows through Spark ~13 s (Arrow into the JVM and out again).
delta-rs (the `deltalake` package: Rust, no JVM) makes the same commits from the Arrow tables
in milliseconds and the large appends in about a second. Its commits are Delta's protocol, so
Spark reads them as its own: `table_changes` / `readChangeFeed` from the change data files its
MERGE writes (update pre/post images, deletes, inserts), `VERSION AS OF`, `DESCRIBE HISTORY`
(engineInfo `delta-rs:...`), and the `txn` actions of both engines (a `txnAppId` either one
committed is honoured by the other; delta-rs does not skip one by itself, so `_rs_append`
looks first). Each delta-rs commit is made at exactly the version after the one it looked at,
or fails (`_rs_commit`: no retries of its own): an append that raced another writer looks
again (was its app id committed meanwhile?), a MERGE compares again, as above, and a snapshot
whose commits keep losing is retried whole (`_retry`). So delta-rs writes every audit table
when the warehouse is on this machine's file system and the session is a classic one
(`_rs_dir`); Spark writes them otherwise (a Spark Connect client, whose files are the
server's; a warehouse on s3a:// or HDFS, which delta-rs would need credentials of its own
for), the same commits either way. The tables delta-rs creates are named in the session's
catalog as Spark's are (spark_jobs/catalog.py), once written, and a table either engine made is
carried on by the other.

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
import operator
import os
import threading
import time
import typing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypeVar

import pyarrow as pa

from service.common.errors import NotFound
from service.common.tls import Credentials
from spark_jobs import delta_log
from spark_jobs.catalog import (
    append,
    ensure_database,
    is_conflict,
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
T = TypeVar("T")
_ARROW = {"str": pa.string(), "int": pa.int64(), "bool": pa.bool_(), "bytes": pa.binary()}


def _arrow_schema(row_type: type) -> pa.Schema:
    return pa.schema(_STAMP + [pa.field(f.name, _ARROW[str(f.type)]) for f in fields(row_type)])


def _arrow_rows(row_type: type, stamp: SnapshotStamp, rows: Sequence[Any]) -> pa.Table:
    schema = _arrow_schema(row_type)
    n = len(rows)
    stamped = [
        pa.repeat(pa.scalar(stamp.snapshot_id, pa.string()), n),
        pa.repeat(pa.scalar(stamp.taken_at, _STAMP[1].type), n),
        pa.repeat(pa.scalar(stamp.master_term, pa.int64()), n),
        pa.repeat(pa.scalar(stamp.committed_index, pa.int64()), n),
    ]
    # Column by column: dataclasses.asdict copies every value of every row, which took half a
    # minute for a few hundred thousand rows.
    data = [
        pa.array(list(map(operator.attrgetter(f.name), rows)), schema.field(f.name).type)
        for f in fields(row_type)
    ]
    return pa.Table.from_arrays(stamped + data, schema=schema)


def _frame(spark: Any, table: pa.Table) -> Any:
    """`table` as a DataFrame, its schema given explicitly: Spark Connect cannot infer one
    from an empty table (an inventory with no hosted replicas, say). Without its empty record
    batches: a classic session takes a table whose first batch is empty for an empty one."""
    from pyspark.sql.pandas.types import from_arrow_schema

    batches = [b for b in table.to_batches() if b.num_rows]
    table = pa.Table.from_batches(batches, schema=table.schema)
    return spark.createDataFrame(table, schema=from_arrow_schema(table.schema))


_BULK = threading.Lock()
"""Held while a large frame (`_bulk_frame`) is made and written: rows from Python stay in the
driver's heap until written, and three kinds of a large catalog at once exhausted it."""

_BULK_ROWS = 20_000
"""From how many rows a frame is a large one (`_bulk_frame`)."""

_BULK_CONF = {
    "spark.sql.execution.arrow.localRelationThreshold": "0",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "100000",
}
"""How a classic session takes a large Arrow table (`_bulk_frame`): as an RDD of Arrow
batches of 100,000 rows, one partition each. Below the threshold (48 MB by default) Spark makes
a local relation of rows instead, and each of its tasks carries half of them, serialized: with
the driver's 1g (conf/spark-defaults.conf) that ran out of memory for a 300,000-row kind, and
took three times as long to write."""


@contextmanager
def _bulk_frame(spark: Any, table: pa.Table) -> Iterator[Any]:
    """`_frame(spark, table)`, to be written inside the block. A large one (`_BULK_ROWS`) is
    made the lighter way (`_BULK_CONF`, a classic session's settings, restored at once) and
    is alone in the driver (`_BULK`) until written."""
    if table.num_rows < _BULK_ROWS:
        yield _frame(spark, table)
        return
    with _BULK:
        if getattr(spark, "_jvm", None) is None:  # Spark Connect: sent to the server as is
            yield _frame(spark, table)
            return
        before = {key: spark.conf.get(key, None) for key in _BULK_CONF}
        try:
            for key, value in _BULK_CONF.items():
                spark.conf.set(key, value)
            frame = _frame(spark, table)
        finally:
            for key, value in before.items():
                if value is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, value)
        yield frame


def _append(
    spark: Any,
    table: pa.Table,
    name: str,
    snapshot_id: str,
    rs: Path | None,
    named: bool = False,
) -> None:
    """Append once per (table, snapshot id): Delta skips a txnAppId's version it has seen.
    With delta-rs when the database is local (`rs`, from `_rs_dir`), else with Spark. `named`:
    the session's catalog has the table (else it is looked for, named if need be: `_named`)."""
    if rs is not None:
        _rs_append(rs / name, table, f"{DATABASE}.{name}.{snapshot_id}")
        if not named:
            _named(spark, name)
        return
    with _bulk_frame(spark, table) as df:
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


def _local(spark: Any, table: str) -> Path | None:
    """The directory of audit table `table` when a classic session reads it from this
    machine's file system (it was created at `table_path`), so its log can be read here
    (spark_jobs/delta_log.py); None for a Spark Connect client (the files are the server's)
    or a table elsewhere."""
    if getattr(spark, "_jvm", None) is None:
        return None
    d = delta_log.local_dir(table_path(spark, DATABASE, table))
    return d if d is not None and (d / "_delta_log").is_dir() else None


def _latest_version(spark: Any, name: str, local: Path | None = None) -> int:
    """The newest version of Delta table `name`: from its log when it is `local`, which costs
    a directory listing instead of a Spark job."""
    if local is not None and (v := delta_log.latest_version(local)) is not None:
        return v
    return int(spark.sql(f"DESCRIBE HISTORY {name} LIMIT 1").collect()[0].version)


def _rs_dir(spark: Any) -> Path | None:
    """Where delta-rs writes the audit tables (module docstring: "Why delta-rs"): the
    database's directory (each table is `<it>/<table>`, as `table_path` says) when a classic
    session keeps the warehouse on this machine's file system and the `deltalake` package is
    there; None (Spark writes them) for a Spark Connect client, whose files are the server's,
    or a warehouse elsewhere (s3a://, hdfs://), which Spark's file systems reach and delta-rs
    would need credentials of its own for. Asked once per snapshot: each question to the
    session's catalog is a round trip to a busy JVM."""
    if getattr(spark, "_jvm", None) is None:
        return None
    try:
        import deltalake  # noqa: F401
    except ImportError:
        return None
    table = delta_log.local_dir(table_path(spark, DATABASE, "snapshots"))
    return table.parent if table is not None else None


def _named(spark: Any, name: str) -> None:
    """Give the table delta-rs wrote at `name`'s path its name in the session's catalog, if
    it has none yet (it was just created here or by another process). Only for a table not
    named already: asking costs Spark a load of the table's log, seconds on a busy machine."""
    if not spark.catalog.tableExists(f"{DATABASE}.{name}"):
        register(spark, DATABASE, name, table_path(spark, DATABASE, name))


_RS_ATTEMPTS = 5
"""How often a delta-rs commit that lost a race (another writer committed that version first)
is made again here, on the table as it now is, before the whole snapshot is retried."""


def _rs_commit(app_id: str | None = None) -> Any:
    """A delta-rs commit at exactly the version after the one read (no retries of its own:
    the caller looks again, as Spark's path does), carrying `app_id`'s txnVersion 1."""
    from deltalake import CommitProperties, Transaction

    txns = [Transaction(app_id, 1)] if app_id is not None else None
    return CommitProperties(max_commit_retries=0, app_transactions=txns)


def _rs_create(where: Path, table: pa.Table, app_id: str | None, cdf: bool = False) -> bool:
    """Create the Delta table in `where` holding `table` with delta-rs (with the change data
    feed when `cdf`; its commit carrying `app_id`'s txnVersion 1): whether this call made it,
    False when another writer had (Delta's log arbitrates: version 0 is written once)."""
    from deltalake import write_deltalake
    from deltalake.exceptions import CommitFailedError

    try:
        write_deltalake(
            str(where),
            table,
            mode="error",
            configuration={"delta.enableChangeDataFeed": "true"} if cdf else None,
            commit_properties=_rs_commit(app_id),
        )
    except CommitFailedError:
        return False
    except Exception as exc:
        if "already exists" not in str(exc).lower():
            raise
        return False
    return True


def _rs_append(where: Path, table: pa.Table, app_id: str) -> None:
    """Append `table` to the Delta table in `where` (created if need be) with delta-rs, once
    per `app_id`: a txnVersion already committed for it (by either writer: both keep Delta's
    `txn` actions) means done. Each try commits at the version after the one whose `txn` it
    checked or fails (`_rs_commit`), so a retry racing another appends nothing twice."""
    from deltalake import DeltaTable, write_deltalake
    from deltalake.exceptions import CommitFailedError

    for attempt in range(1, _RS_ATTEMPTS + 1):
        if delta_log.latest_version(where) is None:
            if _rs_create(where, table, app_id):
                return
            continue  # another writer created it: append to theirs
        current = DeltaTable(str(where))
        if (current.transaction_version(app_id) or 0) >= 1:
            return
        try:
            write_deltalake(
                current,
                table,
                mode="append",
                schema_mode="merge",  # tables written before a column was added
                commit_properties=_rs_commit(app_id),
            )
            return
        except CommitFailedError:
            if attempt == _RS_ATTEMPTS:
                raise
    raise RuntimeError(f"{where}: neither created nor found as a Delta table; not appended")


def _rs_merge(where: Path, table: pa.Table, kind: str, diff: _Diff, version: int) -> int | None:
    """The MERGE of `_merge_current` with delta-rs, on the table as of `version` (the one the
    diff was taken against), committed as `version + 1` or not at all: its version after,
    or None when another writer committed first (the caller compares again)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    keys = KEYS[kind]
    data = [c for c in table.column_names if c not in _stamp_names()]

    def q(c: str) -> str:
        return "`" + c.replace("`", "``") + "`"

    # Each comparison in parentheses: delta-rs's parser reads `a IS NOT DISTINCT FROM b AND c`
    # as `a IS NOT DISTINCT FROM (b AND c)`.
    on = " AND ".join(f"t.{q(k)} = s.{q(k)}" for k in keys)
    same = " AND ".join(f"(t.{q(c)} IS NOT DISTINCT FROM s.{q(c)})" for c in data)
    dt_ = DeltaTable(str(where), version=version)
    merger = dt_.merge(
        _merge_source(table, diff, keys),
        on,
        source_alias="s",
        target_alias="t",
        commit_properties=_rs_commit(),
    )
    if diff.vanished.num_rows:
        merger = merger.when_matched_delete("s.snapshot_id IS NULL")
    if diff.changed.num_rows:
        merger = merger.when_matched_update_all(f"NOT ({same})")
    if diff.added.num_rows:
        merger = merger.when_not_matched_insert_all("s.snapshot_id IS NOT NULL")
    try:
        merger.execute()
    except CommitFailedError:
        return None
    return int(dt_.version())


class _LostRaces(Exception):
    """Another writer committed between each look at a current table and its MERGE."""


def _rs_conflict(exc: BaseException) -> bool:
    """Whether `exc` is a delta-rs commit that lost to another writer (`_RS_ATTEMPTS` times),
    or a MERGE that did (`_LostRaces`)."""
    if isinstance(exc, _LostRaces):
        return True
    try:
        from deltalake.exceptions import CommitFailedError
    except ImportError:
        return False
    return isinstance(exc, CommitFailedError)


_WRITERS = len(Inventory.KINDS)
"""How many kinds are written at the same time. A snapshot's Spark work is mostly the driver's
(planning, the Delta log, compiling), so on two busy cores all six at once took only some 10%
less than one after the other; large frames take turns anyway (`_BULK`)."""


def _stamp_names() -> set[str]:
    return {f.name for f in _STAMP}


@dataclass(frozen=True)
class _Diff:
    """How a snapshot's rows of a kind differ from the current table's, by key."""

    changed: pa.Table
    """Rows of the snapshot whose key is in the table with other data."""
    added: pa.Table
    """Rows of the snapshot whose key is not in the table."""
    vanished: pa.Table
    """Keys of the table that the snapshot lacks (key columns only)."""

    def __bool__(self) -> bool:
        return bool(self.changed.num_rows or self.added.num_rows or self.vanished.num_rows)


def _diff(new: pa.Table, old: pa.Table, keys: Sequence[str]) -> _Diff:
    """Compare the rows of a snapshot (`new`) with the current table's (`old`) by key, on the
    data columns (not the stamp): a join of the keys, then column by column (nulls equal)."""
    import pyarrow.compute as pc

    data = [c for c in new.column_names if c not in _stamp_names()]
    old = pa.table({c: old.column(c).cast(new.schema.field(c).type) for c in data})
    left = new.select(list(keys)).append_column("_new", pa.array(range(new.num_rows), pa.int64()))
    right = old.select(list(keys)).append_column("_old", pa.array(range(old.num_rows), pa.int64()))
    joined = left.join(right, keys=list(keys), join_type="full outer")
    mine, theirs = joined.column("_new"), joined.column("_old")
    vanished = joined.filter(pc.is_null(mine)).select(list(keys))
    if vanished.num_rows:
        vanished = vanished.group_by(list(keys)).aggregate([])  # once each
    both = joined.filter(pc.and_(pc.is_valid(mine), pc.is_valid(theirs)))
    at_new, at_old = both.column("_new"), both.column("_old")
    differ = pa.chunked_array([pa.repeat(pa.scalar(False), both.num_rows)])
    for c in data:
        if c in keys:
            continue
        a, b = new.column(c).take(at_new), old.column(c).take(at_old)
        same = pc.or_kleene(pc.equal(a, b), pc.and_(pc.is_null(a), pc.is_null(b)))
        differ = pc.or_(differ, pc.invert(pc.fill_null(same, False)))

    def rows(at: Any) -> pa.Table:
        at = pc.unique(at)  # once each, even if the current table had a key twice
        return new.take(pc.take(at, pc.sort_indices(at)))

    added = joined.filter(pc.is_null(theirs)).column("_new")
    return _Diff(rows(at_new.filter(differ)), rows(added), vanished)


def _read(spark: Any, name: str, version: int, columns: list[str], local: Path | None) -> pa.Table:
    """`columns` of Delta table `name` at `version`, into Arrow: its Parquet files read here
    when the table is `local` and plain enough (spark_jobs/delta_log.py), else collected by
    Spark. Collecting through Spark cost a job of seconds on a busy machine, a few hundred
    thousand rows more; pyarrow reads the same files in a fraction of one."""
    import pyarrow.parquet as pq

    snap = delta_log.snapshot(local, version) if local is not None else None
    if snap is not None and snap.files:
        try:
            got = pq.read_table(list(snap.files), columns=columns)
            if got.column_names == columns:
                return got
        except (OSError, KeyError, ValueError, pa.ArrowException):
            pass  # vacuumed meanwhile, or files of another schema: Spark knows
    return spark.sql(f"SELECT {', '.join(columns)} FROM {name} VERSION AS OF {version}").toArrow()


def _merge_source(table: pa.Table, diff: _Diff, keys: Sequence[str]) -> pa.Table:
    """A MERGE's source rows for `diff`: the changed and the new rows, and a delete marker per
    vanished key (the key, every other column null, so `snapshot_id IS NULL`)."""
    vanished = diff.vanished
    markers = pa.table(
        {
            f.name: vanished.column(f.name).cast(f.type)
            if f.name in keys
            else pa.nulls(vanished.num_rows, f.type)
            for f in table.schema
        },
        schema=table.schema,
    )
    return pa.concat_tables([diff.changed, diff.added, markers])


def _merge_current(spark: Any, table: pa.Table, kind: str, exists: bool, base: Path | None) -> int:
    """Make `tessera_audit.<kind>` hold exactly `table`'s rows (module docstring), in one
    Delta commit, or none when nothing changed; its Delta version afterwards.

    The current rows are read into Arrow at a pinned version and compared with `table` by key
    here, so an unchanged table costs one read; a changed one then gets one MERGE whose source
    is only the changed and new rows plus a delete marker (the key, every other column null,
    so `snapshot_id IS NULL`) per vanished key. Its change data feed then shows exactly the
    catalog's diff. A commit by another writer between the read and the MERGE makes the diff
    stale: the table is compared again and a MERGE makes up the difference. With delta-rs
    when the database is local (`base`, from `_rs_dir`), else with Spark."""
    name = f"{DATABASE}.{kind}"
    view = f"tessera_audit_src_{kind}"
    rs = base / kind if base is not None else None
    if rs is not None and not exists:
        # Named by the caller afterwards (`_write_snapshot`).
        if delta_log.latest_version(rs) is None and _rs_create(rs, table, None, cdf=True):
            return 0  # a new Delta table's first commit
    elif not exists:
        # Created at its path, then named: in the in-memory catalog a CREATE TABLE of a managed
        # table is refused once another process has created its directory, while a path is
        # Delta's to arbitrate (it fails DELTA_PATH_EXISTS, and write_snapshot tries again).
        path = table_path(spark, DATABASE, kind)
        with _bulk_frame(spark, table) as df:
            df.createOrReplaceTempView(view)
            spark.sql(
                f"CREATE TABLE delta.`{path}` USING delta "
                "TBLPROPERTIES (delta.enableChangeDataFeed = true) "
                f"AS SELECT * FROM {view}"
            )
        register(spark, DATABASE, kind, path)
        return 0  # a new Delta table's first commit
    keys = KEYS[kind]
    data = [c for c in table.column_names if c not in _stamp_names()]
    on = " AND ".join(f"t.{k} = s.{k}" for k in keys)
    same = " AND ".join(f"t.{c} <=> s.{c}" for c in data)
    local = rs if rs is not None else _local(spark, kind)
    version = _latest_version(spark, name, local)
    for _ in range(3):
        current = _read(spark, name, version, data, local)
        diff = _diff(table, current, keys)
        if not diff:
            return version
        if rs is not None:
            after = _rs_merge(rs, table, kind, diff, version)
            if after is not None:
                return after
            version = _latest_version(spark, name, local)  # another writer's: compare again
            continue
        vanished = diff.vanished
        _frame(spark, _merge_source(table, diff, keys)).createOrReplaceTempView(view)
        # Only the clauses this diff needs: Delta runs a MERGE with no WHEN MATCHED clause as
        # one insert, and one with no WHEN NOT MATCHED clause with an inner join.
        clauses = []
        if vanished.num_rows:
            clauses.append("WHEN MATCHED AND s.snapshot_id IS NULL THEN DELETE")
        if diff.changed.num_rows:
            clauses.append(f"WHEN MATCHED AND NOT ({same}) THEN UPDATE SET *")
        if diff.added.num_rows:
            clauses.append("WHEN NOT MATCHED AND s.snapshot_id IS NOT NULL THEN INSERT *")
        spark.sql(f"MERGE INTO {name} t USING {view} s ON {on} {' '.join(clauses)}")
        after = _latest_version(spark, name, local)
        if after == version + 1:  # ours, on the version we compared with
            return after
        version = after  # another writer committed too: compare again
    if rs is not None:  # not ours: the snapshot must not name a version without its rows
        raise _LostRaces(f"{name}: another writer committed before each of 3 MERGEs")
    return version


def _snapshots_state(spark: Any, sid: str) -> tuple[bool, Any]:
    """Whether `snapshots` has `sid`, and its latest row (snapshot id, master term, committed
    index; None when empty), in one query, or from its files when it is local (`_read`)."""
    from pyspark.sql import functions as F

    local = _local(spark, "snapshots")
    if local is not None:
        cols = ["snapshot_id", "master_term", "committed_index", "taken_at"]
        version = delta_log.latest_version(local)
        if version is not None:
            t = _read(spark, f"{DATABASE}.snapshots", version, cols, local).to_pylist()
            latest = max(t, key=lambda r: r["taken_at"], default=None)
            seen = any(r["snapshot_id"] == sid for r in t)
            return seen, SimpleNamespace(**latest) if latest is not None else None
    snaps = spark.table(f"{DATABASE}.snapshots")
    row = snaps.agg(
        F.max(F.col("snapshot_id") == F.lit(sid)).alias("seen"),
        F.max_by(
            F.struct("snapshot_id", "master_term", "committed_index"), F.col("taken_at")
        ).alias("latest"),
    ).collect()[0]
    return bool(row.seen), row.latest


def write_snapshot(spark: Any, inv: Inventory, run_by: RunBy | None = None) -> SnapshotWrite:
    """Write `inv` (module docstring): append it to the `*_history` tables, bring the current
    tables to it (one MERGE of the changed rows each, none for an unchanged table), then
    record it in `snapshots` (the commit point: a snapshot id in `snapshots` was written
    whole). A snapshot id already there, or a catalog at the latest snapshot's master term and
    committed index, writes nothing. Retrying after a failure half-way appends nothing twice
    (history appends carry Delta's txnAppId) and the current tables converge, so a write that
    loses a race with another writer (another job writing the same tables) is retried whole.
    `run_by` (who took it) goes in the `snapshots` row."""
    from spark_jobs.session import require_delta

    require_delta(spark, "an audit snapshot")
    return _retry(lambda: _write_snapshot(spark, inv, run_by))


def _retry(action: Callable[[], T], attempts: int = 6) -> T:
    """Run `action` (idempotent: `_write_snapshot` is) again after a short pause each time it
    loses a race with another writer: a Spark commit's conflict (`is_conflict`, as
    `retry_on_conflict` of spark_jobs/catalog.py) or a delta-rs one (`_rs_conflict`)."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == attempts or not (is_conflict(exc) or _rs_conflict(exc)):
                raise
            time.sleep(0.2 * attempt)  # back off, so two writers stop colliding
    raise AssertionError("unreachable")  # pragma: no cover


def _write_snapshot(spark: Any, inv: Inventory, run_by: RunBy | None) -> SnapshotWrite:
    who = run_by or RunBy.of(None)
    ensure_database(spark, DATABASE)
    sid = inv.stamp.snapshot_id
    counts = {kind: len(inv.rows(kind)) for kind in Inventory.KINDS}
    existing = _tables(spark)
    if "snapshots" in existing:
        seen, latest = _snapshots_state(spark, sid)
        if seen:
            return SnapshotWrite("exists", counts, {}, sid)
        if latest and (latest.master_term, latest.committed_index) == (
            inv.stamp.master_term,
            inv.stamp.committed_index,
        ):
            return SnapshotWrite("unchanged", counts, {}, latest.snapshot_id)

    rs = _rs_dir(spark)

    def write(kind: str, row_type: type) -> int:
        rows = _arrow_rows(row_type, inv.stamp, inv.rows(kind))
        if rows.num_rows or f"{kind}_history" not in existing:  # no empty commits
            history = f"{kind}_history"
            # delta-rs's new tables are named after the writes (below)
            _append(spark, rows, history, sid, rs, named=rs is not None or history in existing)
        return _merge_current(spark, rows, kind, kind in existing, rs)

    if getattr(spark, "_jvm", None) is not None:
        from pyspark.util import inheritable_thread_target

        # The caller's job group, description and tags hold in the writing threads too.
        write = inheritable_thread_target(spark)(write)
    # The kinds' tables are independent: written at the same time (`_WRITERS`).
    with ThreadPoolExecutor(_WRITERS, thread_name_prefix="audit") as pool:
        done = {kind: pool.submit(write, kind, t) for kind, t in Inventory.KINDS.items()}
    versions = {kind: future.result() for kind, future in done.items()}
    if rs is not None:
        # The tables delta-rs created (here or in another process) get their names one after
        # the other once written: naming one makes Spark rebuild its state from the log (it
        # has no checksum file from delta-rs), half a second each on a warm JVM, and a dozen
        # at once, with the writers' threads, took 10 to 40 s each on a busy machine.
        for kind in Inventory.KINDS:
            for name in (kind, f"{kind}_history"):
                if name not in existing:
                    _named(spark, name)
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
    _append(spark, summary, "snapshots", sid, rs, named="snapshots" in existing)
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
