"""The "tessera" PySpark DataSource: one Spark partition per tablet, and writes.

    spark.read.format("tessera").option("masters", "h1:7051,h2:7051").option("table", "t").load()
    df.write.format("tessera").option("masters", ...).option("table", "t").mode("append").save()
    CREATE TEMPORARY VIEW v USING tessera OPTIONS (masters 'h1:7051', table 't')

Theory of operation
-------------------
Spark runs a Python data source in three places: `schema()` and `partitions()` in a Python
worker beside the driver, once per planned scan; `read(partition)` in executor workers, once per
partition; the writer's `write()` once per task. Each of them reaches the cluster through
`SyncClient.shared(masters)`, one client per worker process and master list, so the many tasks
a reused worker runs share channels and the location cache.

Reading (kudu-spark's design):

* the schema comes from the master: every column, exact type mapping (`spark_type`), each
  column's own nullability (Spark checks every batch against it). Spark offers Python sources
  no column pruning, so the `columns` option is the way to read fewer columns;
* Spark's filters are not pushed down: Spark 4.2 reuses a pushed-down read plan across scans of
  one DataFrame or view (the note above `TesseraReader` says how), so a source that pushed
  them could return the previous query's rows. Spark evaluates every filter; the `where`
  option asks the tablet servers to evaluate conditions and prunes the tablets they exclude;
* `partitions()` asks the client for scan tokens: one per tablet, minus the tablets the `where`
  key conditions prune (`service.client.pruning`). The token carries the replicas, so the
  executor need not ask the master. Spark plans a DataFrame's partitions once and keeps them
  for the DataFrame's life: `load()` again to see tablets added since;
* `read()` scans its token with `TabletScanner`: the replica is chosen inside the task
  (`replica_selection`: `leader` or `closest`, Spark gives Python sources no preferred
  locations), and with `fault_tolerant` a failed replica is replaced by another one, resuming
  after the last key returned. Batches are cast to exactly the declared Arrow schema, types and
  nullability (Spark does not cast Python-source batches itself).

Snapshots (docs/design/tablets.md#R4): by default a read is a snapshot read at one hybrid
timestamp, taken when the DataFrame is loaded (`spark.read...load()`, or when a temporary view
is created). Every task, retried task and fault-tolerant resume of every action on that
DataFrame reads the table exactly as of it: `df.count()` twice, and a write of `df` to another
table, see the same rows while writers go on. A DataFrame, or view, therefore does not see
writes made after it was loaded: load it again (CREATE OR REPLACE the view) to read newer
data, and it must be used within `tablet_history_max_age` (15 minutes by default) of loading,
after which its reads fail with SNAPSHOT_TOO_OLD naming the horizon. `snapshot_timestamp_ms`
or `as_of` pin another time; `read_mode=latest` reads each tablet's newest rows when its task
runs (the behaviour before snapshots: faster on a lagging replica, but no consistent table).

Writing: an Arrow writer (`DataSourceArrowWriter`) per task feeds its batches to one
`WriteSession` (routing per tablet leader, batching, retries) with the chosen `operation`.
A row the tablet server refuses fails the task with a message naming the row's key and the
reason, unless `row_errors=report`, which counts the failures in the commit message and logs
them on the driver. `overwrite` mode is refused unless `truncate=true` is given, which deletes
every row of the table once, when the write is planned, before any task writes.

Atomic writes (docs/design/transactions.md#R4). By default a write is one transaction: the
driver begins it when the write is planned (with a keep-alive period of `WRITE_KEEPALIVE_MS`:
nothing sends keep-alives while tasks wait to be scheduled; each task sends them while it
writes), every task attempt stages its rows under its own attempt id (`task-<attempt id>`),
and Spark's `commit` on the driver commits the transaction with exactly the attempts whose
commit messages it got: a failed, retried or speculative attempt's rows are dropped. A job that
fails calls `abort`, which aborts it: the table is left as it was. `truncate=true` stages its
deletes in the same transaction, so an overwrite is atomic too. `transactional=false` writes each
task's rows as they come (a bulk load; what a failure leaves is what was written).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from service.client.credentials import (
    ENV_VAR,
    credentials_from_token,
    find_credentials,
    load_token_file,
)
from service.client.meta_cache import TableHandle
from service.client.scanner import REPLICA_SELECTIONS, ScanToken
from service.client.sync import SyncClient
from service.client.write_session import OPERATIONS, format_errors
from service.common.errors import InvalidArgument, NotFound, TesseraError
from service.common.hybrid_time import from_micros, from_millis
from service.common.predicates import IS_DELETED, ColumnPredicate, ScanSpec, validate_spec
from service.common.schema import ColumnSchema, ColumnType, Schema
from service.common.tls import Credentials

__all__ = [
    "FORMAT",
    "ReadOptions",
    "TesseraDataSource",
    "register",
    "register_views",
    "spark_schema",
    "spark_type",
]

log = logging.getLogger(__name__)

FORMAT = "tessera"

_SIMPLE_TYPES: dict[ColumnType, DataType] = {
    ColumnType.BOOL: BooleanType(),
    ColumnType.INT8: ByteType(),
    ColumnType.INT16: ShortType(),
    ColumnType.INT32: IntegerType(),
    ColumnType.INT64: LongType(),
    ColumnType.FLOAT: FloatType(),
    ColumnType.DOUBLE: DoubleType(),
    ColumnType.STRING: StringType(),
    ColumnType.BINARY: BinaryType(),
    ColumnType.TIMESTAMP: TimestampType(),
    ColumnType.DATE: DateType(),
}


def spark_type(col: ColumnSchema) -> DataType:
    """The Spark SQL type of a Tessera column (exact: no widening, no loss)."""
    if col.type is ColumnType.DECIMAL:
        assert col.precision is not None and col.scale is not None
        return DecimalType(col.precision, col.scale)
    return _SIMPLE_TYPES[col.type]


def spark_schema(schema: Schema, columns: Sequence[str] | None = None) -> StructType:
    """The Spark schema of a read: each column with its own type and its own nullability.

    Nullability must be the column's, not "is it a key": Spark checks every batch a Python
    source yields against the declared schema, nullability included, and the tablet servers
    send NOT NULL columns as non-nullable Arrow fields.
    """
    names = list(columns) if columns is not None else list(schema.column_names)
    return StructType(
        [
            StructField(n, spark_type(schema.column(n)), nullable=schema.column(n).nullable)
            for n in names
        ]
    )


# --- options ---------------------------------------------------------------------------------

OPTIONS: dict[str, str] = {
    "masters": "required: the master addresses, host:port[,host:port...]",
    "credentials": "a directory with ca.pem, cert.pem and key.pem for a secured cluster, or a "
    "credentials token file, read on the driver (default: $TESSERA_CREDENTIALS); executors "
    "receive the credentials inside their tasks, never in options, plans, logs or the UI",
    "token": "instead of credentials: a credentials token's text (`tessera token create --user "
    "NAME --token-file F`). The plan and UI show no option of this source, and Spark's default "
    "redaction pattern covers option names containing 'token' in any case",
    "token_file": "instead of credentials: the path of a credentials token file, read on the "
    "driver",
    "table": "required: the table name",
    "columns": "read: the columns to read, comma separated (default: every column)",
    "where": "read: conditions the tablet servers evaluate, joined by AND (COL OP VALUE, "
    "COL in (...), COL is [not] null, COL startswith VALUE); tablets that cannot match are not "
    "read. Spark's own filters are not pushed down (see the module docstring)",
    "replica_selection": "read: leader (default) or closest (a replica on this host first)",
    "fault_tolerant": "read: true (default) resumes on another replica after a failure",
    "batch_size_bytes": "read: scan page size asked of the tablet server (default 2097152)",
    "split_size_rows": "read: cut tablets into key ranges of about this many live rows, one "
    "Spark partition each; a tablet server picks the split keys from its sorted keys "
    "(SplitKeyRange), so planning reads no rows (default 0: one partition per tablet)",
    "scan_timeout_ms": "read: how long one tablet's scan may keep failing over (default 120000)",
    "read_mode": "read: snapshot (default: every task, retry and action of one DataFrame reads "
    "the table as of one hybrid timestamp, taken when the DataFrame is loaded) or latest (each "
    "tablet's newest rows when its task reads it)",
    "snapshot_timestamp_ms": "read: read the table as of this time, in milliseconds since the "
    "epoch (kudu-spark's kudu.snapshotTimestampMs); within tablet_history_max_age",
    "as_of": "read: read the table as of this time, ISO 8601 (2026-11-29T10:00:00Z; no zone "
    "means UTC); within tablet_history_max_age",
    "snapshot_hybrid_time": "read: the exact hybrid timestamp to read at (what a backup "
    "records; service/common/hybrid_time.py)",
    "diff_start_hybrid_time": "read: a diff scan, with snapshot_hybrid_time: only the rows whose "
    "state at the snapshot was committed after this hybrid timestamp, deleted ones included, "
    f"with a boolean column {IS_DELETED} (what an incremental backup appends)",
    "rpc_timeout_ms": "read and write: deadline of one RPC / write flush (default 30000)",
    "operation": "write: insert, upsert (default), update, delete or insert_ignore",
    "row_errors": "write: fail (default: a refused row fails the task) or report",
    "truncate": "write: with mode overwrite, true deletes every row first (default false)",
    "create_if_missing": "write: true creates the table from the DataFrame's schema when it "
    "does not exist (with key, and hash and range if wanted; spark_jobs/tables.py)",
    "key": "write, with create_if_missing: the primary key column(s), comma separated",
    "hash": "write, with create_if_missing: hash partitioning COL[,COL]:BUCKETS[:SEED], "
    "several separated by ';'",
    "range": "write, with create_if_missing: range partitioning columns, comma separated",
    "replicas": "write, with create_if_missing: the replica count (default 3)",
    "transactional": "write: true (default) makes the whole write one transaction: its rows appear "
    "together when the job commits, or not at all if it fails; false writes each task's rows "
    "as they come (a bulk load that a failure may leave half done)",
    "query_name": "streaming write: the name under which committed batch ids are kept "
    "(default: the table name)",
    "commit_table": "streaming write: the Tessera table that keeps them (default "
    "tessera_stream_commits, made on first use)",
    "checkpointlocation": "streaming write: Spark's own option (its checkpoint directory)",
}
"""Every option the source accepts, with its meaning; anything else is refused by name."""


def _read_mode(opts: Mapping[str, str]) -> tuple[str, int]:
    """(read_mode, pinned snapshot timestamp or 0) from the read options (module docstring,
    Snapshots); InvalidArgument naming the option."""
    mode = opts.get("read_mode", "snapshot").strip().lower()
    if mode not in ("snapshot", "latest"):
        raise InvalidArgument(f"option 'read_mode': expected snapshot or latest, got {mode!r}")
    pinned = [
        k
        for k in ("snapshot_timestamp_ms", "as_of", "snapshot_hybrid_time")
        if opts.get(k, "").strip()
    ]
    if len(pinned) > 1:
        raise InvalidArgument(
            f"options {' and '.join(repr(k) for k in pinned)}: give one time to read the table at"
        )
    if pinned and mode == "latest":
        raise InvalidArgument(
            f"option {pinned[0]!r} pins a snapshot: it does not go with read_mode=latest"
        )
    if not pinned:
        return mode, 0
    if pinned[0] == "snapshot_hybrid_time":
        ts = _int("snapshot_hybrid_time", opts["snapshot_hybrid_time"].strip())
        if ts <= 0:
            raise InvalidArgument("option 'snapshot_hybrid_time': must be > 0")
        return mode, ts
    if pinned[0] == "snapshot_timestamp_ms":
        ms = _int("snapshot_timestamp_ms", opts["snapshot_timestamp_ms"].strip())
    else:
        text = opts["as_of"].strip()
        try:
            when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidArgument(
                f"option 'as_of': {text!r} is not an ISO 8601 time (2026-11-29T10:00:00Z)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        ms = int(when.timestamp() * 1000)
    if ms <= 0:
        raise InvalidArgument(f"option {pinned[0]!r}: must be a time after the epoch")
    return mode, from_millis(ms)


def _diff_start(opts: Mapping[str, str], snapshot: int) -> int:
    text = opts.get("diff_start_hybrid_time", "").strip()
    if not text:
        return 0
    start = _int("diff_start_hybrid_time", text)
    if not snapshot:
        raise InvalidArgument(
            "option 'diff_start_hybrid_time': a diff reads up to a snapshot; give "
            "snapshot_hybrid_time too"
        )
    if start >= snapshot:
        raise InvalidArgument(
            f"option 'diff_start_hybrid_time': {start} is not before the snapshot {snapshot}"
        )
    return start


def _bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {name!r}: expected true or false, got {value!r}")


def _int(name: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise InvalidArgument(f"option {name!r}: expected an integer, got {value!r}") from None
    if n < 0:
        raise InvalidArgument(f"option {name!r}: must be >= 0, got {n}")
    return n


@dataclass(frozen=True)
class ReadOptions:
    """The parsed, validated options of one read or write."""

    masters: tuple[str, ...]
    table: str
    credentials_dir: str | None = None
    token: str | None = field(default=None, repr=False)
    token_file: str | None = field(default=None, repr=False)
    columns: tuple[str, ...] | None = None
    where: str | None = None
    replica_selection: str = "leader"
    fault_tolerant: bool = True
    batch_size_bytes: int = 0
    split_size_rows: int = 0
    scan_timeout_s: float = 120.0
    rpc_timeout_s: float = 30.0
    operation: str = "upsert"
    row_errors: str = "fail"
    truncate: bool = False
    transactional: bool = True
    create_if_missing: bool = False
    create_key: str = ""
    create_hash: str = ""
    create_range: str = ""
    create_replicas: int = 3
    read_mode: str = "snapshot"
    diff_start: int = 0
    """A diff scan from this hybrid timestamp (`diff_start_hybrid_time`); 0: a plain read."""
    snapshot_timestamp: int = 0
    """The hybrid timestamp the read is pinned to by `snapshot_timestamp_ms` or `as_of`; 0:
    the source takes one when the DataFrame is loaded (`TesseraDataSource`)."""
    shipped: ShippedCredentials | None = field(default=None, repr=False, compare=False)
    """The driver's credentials, loaded once and carried to executors inside the pickled
    reader partitions and writer (`with_shipped_credentials`): executors on other machines need
    no credentials files, and nothing of them is in an option, a plan, a log or the UI."""

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = {k.lower(): v for k, v in options.items() if k.lower() != "path"}
        if any(k.startswith("option.") for k in opts):
            # Spark's catalog path (CREATE TABLE ... USING) prefixes every option so; it
            # cannot read a Python data source back (SELECT fails with "not a valid Spark SQL
            # Data Source"), so such a table is refused here, at CREATE, with the way that works.
            raise InvalidArgument(
                f"CREATE TABLE ... USING {FORMAT} (a catalog table) is not supported: Spark "
                "cannot read a Python data source through its catalog. Use CREATE TEMPORARY "
                f"VIEW name USING {FORMAT} OPTIONS (masters '...', table '...'), or "
                "spark_jobs.datasource.register_views(spark, masters) for every table; to "
                "create a Tessera table from Spark: spark_jobs.tables.create_table(...), or "
                "df.write with option create_if_missing=true and key=..."
            )
        unknown = sorted(set(opts) - set(OPTIONS))
        if unknown:
            raise InvalidArgument(
                f"unknown option {unknown[0]!r} for format {FORMAT!r}; known options: "
                + ", ".join(sorted(OPTIONS))
            )
        masters = tuple(a.strip() for a in opts.get("masters", "").split(",") if a.strip())
        if not masters:
            raise InvalidArgument("option 'masters' is required (host:port[,host:port...])")
        table = opts.get("table", "").strip()
        if not table:
            raise InvalidArgument("option 'table' is required")
        sel = opts.get("replica_selection", "leader").strip().lower()
        if sel not in REPLICA_SELECTIONS:
            raise InvalidArgument(
                f"option 'replica_selection': expected {' or '.join(REPLICA_SELECTIONS)}, "
                f"got {sel!r}"
            )
        op = opts.get("operation", "upsert").strip().lower()
        if op not in OPERATIONS:
            raise InvalidArgument(
                f"option 'operation': expected one of {', '.join(OPERATIONS)}, got {op!r}"
            )
        row_errors = opts.get("row_errors", "fail").strip().lower()
        if row_errors not in ("fail", "report"):
            raise InvalidArgument(
                f"option 'row_errors': expected fail or report, got {row_errors!r}"
            )
        cols = opts.get("columns")
        read_mode, snapshot = _read_mode(opts)
        given = [k for k in ("credentials", "token", "token_file") if opts.get(k, "").strip()]
        if len(given) > 1:
            raise InvalidArgument(
                f"options {' and '.join(repr(k) for k in given)}: give only one way to "
                "authenticate (credentials, token or token_file)"
            )
        # $TESSERA_CREDENTIALS only when no option names the credentials.
        credentials_dir = opts["credentials"].strip() if "credentials" in given else None
        if not given:
            credentials_dir = os.environ.get(ENV_VAR) or None
        return cls(
            masters=masters,
            table=table,
            credentials_dir=credentials_dir,
            token=opts.get("token", "").strip() or None,
            token_file=opts.get("token_file", "").strip() or None,
            columns=tuple(c.strip() for c in cols.split(",") if c.strip()) if cols else None,
            where=opts["where"] if opts.get("where", "").strip() else None,
            replica_selection=sel,
            fault_tolerant=_bool("fault_tolerant", opts.get("fault_tolerant", "true")),
            batch_size_bytes=_int("batch_size_bytes", opts.get("batch_size_bytes", "0")),
            split_size_rows=_int("split_size_rows", opts.get("split_size_rows", "0")),
            scan_timeout_s=_int("scan_timeout_ms", opts.get("scan_timeout_ms", "120000")) / 1000,
            rpc_timeout_s=max(
                0.001, _int("rpc_timeout_ms", opts.get("rpc_timeout_ms", "30000")) / 1000
            ),
            operation=op,
            row_errors=row_errors,
            truncate=_bool("truncate", opts.get("truncate", "false")),
            transactional=_bool("transactional", opts.get("transactional", "true")),
            create_if_missing=_bool("create_if_missing", opts.get("create_if_missing", "false")),
            create_key=opts.get("key", "").strip(),
            create_hash=opts.get("hash", "").strip(),
            create_range=opts.get("range", "").strip(),
            create_replicas=_int("replicas", opts.get("replicas", "3")),
            read_mode=read_mode,
            snapshot_timestamp=snapshot,
            diff_start=_diff_start(opts, snapshot),
        )

    def credentials(self) -> Credentials | None:
        if self.shipped is not None:
            return self.shipped.load()
        return self._load_credentials()

    def _load_credentials(self) -> Credentials | None:
        if self.token is not None:
            try:
                return credentials_from_token(self.token)
            except InvalidArgument as e:
                raise InvalidArgument(f"option 'token': {e.message}") from None
        if self.token_file is not None:
            try:
                return load_token_file(self.token_file)
            except InvalidArgument as e:
                raise InvalidArgument(f"option 'token_file': {e.message}") from None
        return find_credentials(self.credentials_dir)

    def with_shipped_credentials(self) -> ReadOptions:
        """These options carrying the driver's loaded credentials (see `shipped`); the token
        text itself does not travel."""
        creds = self._load_credentials()
        return replace(self, token=None, shipped=ShippedCredentials.of(creds) if creds else None)

    def client(self) -> SyncClient:
        return SyncClient.shared(
            self.masters, timeout=self.rpc_timeout_s, credentials=self.credentials()
        )

    def table_info(self) -> TableHandle:
        info: TableHandle = self.client().call("open_table", self.table, refresh=True)
        if self.columns is not None:
            for c in self.columns:
                if not info.schema.has_column(c):
                    raise InvalidArgument(
                        f"option 'columns': table {self.table!r} has no column {c!r}"
                    )
        return info


@dataclass(frozen=True)
class ShippedCredentials:
    """A party's credentials as bytes, to travel inside Spark tasks (`ReadOptions.shipped`).
    Give Spark a short-lived user credential (`tessera token create --user`), not an admin's:
    whoever can read the tasks' bytes can use it until it expires."""

    ca_pem: bytes = field(repr=False)
    cert_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)

    @classmethod
    def of(cls, creds: Credentials) -> ShippedCredentials:
        return cls(creds.ca_pem, creds.cert_pem, creds.key_pem)

    def load(self) -> Credentials:
        return Credentials.from_pems(self.ca_pem, self.cert_pem, self.key_pem)


# --- the source ------------------------------------------------------------------------------


class TesseraDataSource(DataSource):
    """`format("tessera")`: reads and writes Tessera tables (module docstring)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        # Spark makes one instance per loaded DataFrame (or temporary view) and plans every
        # action on it from that instance: a timestamp taken here is the DataFrame's snapshot
        # (module docstring, Snapshots).
        self.loaded_at = from_micros(time.time_ns() // 1000)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        opts = ReadOptions.parse(self.options)
        table_schema = opts.table_info().schema
        out = spark_schema(table_schema, opts.columns)
        if opts.diff_start:
            # A deleted key's row holds nulls in every other column, NOT NULL ones too: a diff
            # declares those nullable (Spark fails on a null in a non-nullable field).
            keys = {c.name for c in table_schema.key_columns}
            out = StructType(
                [StructField(f.name, f.dataType, f.nullable or f.name not in keys) for f in out]
            )
            out = out.add(StructField(IS_DELETED, BooleanType(), nullable=False))
        return out

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = ReadOptions.parse(self.options).with_shipped_credentials()
        if opts.read_mode == "snapshot" and not opts.snapshot_timestamp:
            opts = replace(opts, snapshot_timestamp=self.loaded_at)
        return TesseraReader(opts, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`writeStream.format("tessera")`: exactly once, one transaction per micro-batch
        (spark_jobs/stream_sink.py)."""
        from spark_jobs.stream_sink import TesseraStreamWriter

        if overwrite:
            raise InvalidArgument("a streaming write to tessera appends (outputMode append)")
        opts = ReadOptions.parse(self.options).with_shipped_credentials()
        return TesseraStreamWriter.create(opts, schema, dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        opts = ReadOptions.parse(self.options).with_shipped_credentials()
        info = _table_to_write(opts, schema)
        check_write_schema(info, schema, opts.operation)
        if overwrite and not opts.truncate:
            raise InvalidArgument(
                f"mode 'overwrite' would delete every row of table {opts.table!r}: "
                "refused; use mode 'append', or add option truncate=true to delete the "
                "table's rows before writing"
            )
        txn_id = snapshot = 0
        if opts.transactional:
            client = opts.client()
            txn = client.call("begin_transaction", keepalive_ms=WRITE_KEEPALIVE_MS)
            txn.stop_keepalive()  # this process may be gone by the time the tasks run
            txn_id, snapshot = txn.txn_id, txn.start_timestamp
        try:
            if overwrite:
                truncate(opts, info, txn_id, snapshot)
        except BaseException:
            if txn_id:
                _abort(opts, txn_id, "the write's truncate failed")
            raise
        return TesseraWriter(opts, info.schema.version, txn_id)


# --- reading ---------------------------------------------------------------------------------

# Why the reader does not implement pushFilters
# ----------------------------------------------
# Spark 4.2's Python scan builder stores the read function and partitions that a pushFilters
# pass produced on the data source object shared by every scan of one relation, and a later scan
# of that relation with no filter Spark can hand to Python (a plain count, a filter that is not a
# simple comparison) reuses them. A reader that kept the pushed predicates would then silently
# apply the previous query's filter: on one DataFrame, count, count where id = 5, count again
# returned 60000, 1, 1, and a read-then-write copied 10 of 60,000 rows. Nothing a Python source
# sees can tell the two scans apart (the reused read runs no Python on the driver at all), so
# the only source that cannot be fooled is one whose plan does not depend on Spark's filters.
# Spark evaluates every filter itself; the `where` option, part of the relation's options and so
# of its identity, is the way to have tablet servers filter and prune (see README).


def parse_where_option(schema: Schema, text: str) -> tuple[ColumnPredicate, ...]:
    """The `where` option: conditions joined by AND, each as the CLI's `--where` accepts them
    (`COL OP VALUE`, `COL in (...)`, `COL is [not] null`, `COL startswith VALUE`)."""
    from service.tools.table_syntax import parse_where  # the CLI's grammar, one home for it

    preds = []
    for cond in _split_and(text):
        try:
            p = parse_where(schema, cond)
        except InvalidArgument as e:
            raise InvalidArgument(f"option 'where': {e}") from None
        if p.op in ("NE", "LIKE"):
            raise InvalidArgument(
                f"option 'where': {cond!r}: tablet servers do not evaluate != or a LIKE "
                "that is not a plain prefix ('abc%'); use DataFrame.filter for it"
            )
        preds.append(p)
    if not preds:
        raise InvalidArgument("option 'where': no condition given")
    validate_spec(schema, ScanSpec(predicates=tuple(preds)))
    return tuple(preds)


def _split_and(text: str) -> list[str]:
    """Split on the word AND outside quotes and parentheses."""
    out: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(text):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif (
            depth == 0
            and text[i : i + 3].lower() == "and"
            and (i == 0 or text[i - 1].isspace())
            and (i + 3 == len(text) or text[i + 3].isspace())
        ):
            out.append(text[start:i].strip())
            start = i = i + 3
            continue
        i += 1
    out.append(text[start:].strip())
    return [c for c in out if c]


@dataclass
class TabletPartition(InputPartition):
    """One scan token, the unit a Spark task reads, with the credentials to read it (never
    printed: Spark shows partitions nowhere, and their repr hides them)."""

    token: bytes = field(repr=False)
    tablet_id: str = ""
    credentials: ShippedCredentials | None = field(default=None, repr=False)


class TesseraReader(DataSourceReader):
    """Plans one partition per tablet (or key range) and reads it; see the note above on why
    Spark's filters are not pushed."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.columns = tuple(f.name for f in schema.fields if f.name != IS_DELETED)
        self.nullable = {f.name: f.nullable for f in schema.fields}

    def partitions(self) -> Sequence[InputPartition]:
        predicates: tuple[ColumnPredicate, ...] = ()
        if self.opts.where is not None:
            predicates = parse_where_option(self.opts.table_info().schema, self.opts.where)
        tokens: list[ScanToken] = self.opts.client().scan_tokens(
            self.opts.table,
            projection=self.columns,
            predicates=list(predicates),
            replica_selection=self.opts.replica_selection,
            fault_tolerant=self.opts.fault_tolerant,
            batch_size_bytes=self.opts.batch_size_bytes,
            rpc_timeout_s=self.opts.rpc_timeout_s,
            scan_timeout_s=self.opts.scan_timeout_s,
            snapshot=self.opts.snapshot_timestamp or None,
            diff_start=self.opts.diff_start,
        )
        if self.opts.split_size_rows:
            client = self.opts.client()
            tokens = [
                piece
                for t in tokens
                for piece in client.call("split_token", t, self.opts.split_size_rows)
            ]
        if not tokens:
            return [TabletPartition(b"", "")]  # Spark needs one partition; it reads nothing
        creds = self.opts.shipped
        return [TabletPartition(t.to_bytes(), t.tablet_id, creds) for t in tokens]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TabletPartition)
        if not partition.token:
            return
        token = ScanToken.from_bytes(partition.token)
        client = SyncClient.shared(
            token.masters,
            timeout=token.rpc_timeout_s,
            credentials=partition.credentials.load() if partition.credentials else None,
        )
        target: pa.Schema | None = None
        for batch in client.scan_batches(token):
            if target is None:
                target = arrow_target(batch.schema, self.nullable)
            yield batch if batch.schema.equals(target) else batch.cast(target)


def arrow_target(schema: pa.Schema, nullable: Mapping[str, bool] | None = None) -> pa.Schema:
    """The Arrow schema Spark expects for a Tessera batch: the declared nullability of each
    column (Spark compares it, and a NOT NULL column arrives as a non-nullable field),
    timestamps as Spark's session-less UTC microseconds, everything else as the tablet server
    sends it."""
    fields = []
    for f in schema:
        if pa.types.is_timestamp(f.type):
            f = f.with_type(pa.timestamp("us", tz="UTC"))
        if nullable is not None and f.name in nullable:
            f = f.with_nullable(nullable[f.name])
        fields.append(f)
    return pa.schema(fields)


# --- writing ---------------------------------------------------------------------------------

_FAMILIES: dict[ColumnType, tuple[type, ...]] = {
    ColumnType.BOOL: (BooleanType,),
    ColumnType.INT8: (ByteType, ShortType, IntegerType, LongType),
    ColumnType.INT16: (ByteType, ShortType, IntegerType, LongType),
    ColumnType.INT32: (ByteType, ShortType, IntegerType, LongType),
    ColumnType.INT64: (ByteType, ShortType, IntegerType, LongType),
    ColumnType.FLOAT: (FloatType, DoubleType),
    ColumnType.DOUBLE: (FloatType, DoubleType),
    ColumnType.STRING: (StringType,),
    ColumnType.BINARY: (BinaryType,),
    ColumnType.TIMESTAMP: (TimestampType, TimestampNTZType),
    ColumnType.DATE: (DateType,),
    ColumnType.DECIMAL: (DecimalType,),
}
"""Spark types a DataFrame column may have to be written into a Tessera column: the same kind
of value (integers into integers, and so on), converted with overflow checks per batch."""


def check_write_schema(info: TableHandle, schema: StructType, operation: str) -> None:
    """Refuse, before any task runs, a DataFrame that cannot be written to the table."""
    for f in schema.fields:
        if not info.schema.has_column(f.name):
            raise InvalidArgument(
                f"column {f.name!r} of the DataFrame is not in table {info.name!r} "
                f"(columns: {', '.join(info.schema.column_names)})"
            )
        col = info.schema.column(f.name)
        if not isinstance(f.dataType, _FAMILIES[col.type]):
            raise InvalidArgument(
                f"column {f.name!r}: the DataFrame has {f.dataType.simpleString()}, table "
                f"{info.name!r} has {col.type_name}; cast the column first"
            )
    names = {f.name for f in schema.fields}
    for k in info.schema.key_columns:
        if k.name not in names:
            raise InvalidArgument(
                f"the DataFrame has no column {k.name!r}, part of the primary key of table "
                f"{info.name!r}; every {operation} needs the key"
            )
    if operation in ("insert", "upsert", "insert_ignore"):
        for c in info.schema.columns:
            if c.name not in names and not c.nullable and c.default is None:
                raise InvalidArgument(
                    f"the DataFrame has no column {c.name!r}: table {info.name!r} declares it "
                    f"NOT NULL with no default, and an {operation} may create rows"
                )


def _table_to_write(opts: ReadOptions, schema: StructType) -> TableHandle:
    """The table a write goes to; with `create_if_missing`, created from the DataFrame's
    schema when it does not exist (spark_jobs/tables.py), before any task runs."""
    if not opts.create_if_missing:
        if opts.create_key or opts.create_hash or opts.create_range:
            raise InvalidArgument(
                "options 'key', 'hash' and 'range' describe a table to create: they need "
                "create_if_missing=true"
            )
        return opts.table_info()
    try:
        return opts.table_info()
    except NotFound:
        pass
    from spark_jobs.tables import create_table

    if not opts.create_key:
        raise InvalidArgument(
            f"table {opts.table!r} does not exist: create_if_missing needs option 'key' (its "
            "primary key columns)"
        )
    if opts.operation not in ("insert", "upsert", "insert_ignore"):
        raise InvalidArgument(
            f"table {opts.table!r} does not exist: a {opts.operation} has no rows to act on"
        )
    create_table(
        opts.table,
        schema,
        masters=opts.masters,
        key=opts.create_key,
        hash=opts.create_hash,
        range=opts.create_range,
        replicas=opts.create_replicas,
        client=opts.client(),
    )
    return opts.table_info()


def truncate(opts: ReadOptions, info: TableHandle, txn_id: int = 0, snapshot: int = 0) -> int:
    """Delete every row of the table (overwrite with truncate=true); the rows deleted. In a
    transaction (`txn_id`), the deletes are staged in it (attempt "truncate"), read at its
    snapshot, so they land with the write's rows or not at all."""
    client = opts.client()
    keys = [c.name for c in info.schema.key_columns]
    deleted = 0
    session = client.call(
        "new_session", opts.table, timeout=opts.rpc_timeout_s, txn_id=txn_id, txn_attempt="truncate"
    )
    for tok in client.scan_tokens(opts.table, projection=keys, snapshot=snapshot or None):
        for batch in client.scan_batches(tok):
            client.run(session.apply(batch, "delete"))
            deleted += batch.num_rows
    client.run(session.flush())
    return deleted


def _abort(opts: ReadOptions, txn_id: int, reason: str) -> None:
    client = opts.client()
    txn = client.run(client.client.attach_transaction(txn_id))
    try:
        client.run(txn.abort(reason))
    except TesseraError as e:
        log.warning("tessera write to %r: abort of transaction %d: %s", opts.table, txn_id, e)


@dataclass
class TesseraCommit(WriterCommitMessage):
    rows_applied: int = 0
    rows_failed: int = 0
    error_samples: list[str] = field(default_factory=list)
    attempt: str = ""
    """The task attempt whose staged rows this message vouches for (atomic writes)."""


WRITE_KEEPALIVE_MS = 600_000
"""An atomic write's keep-alive period: 10 minutes without a running task or a commit (a
driver that died) and the master aborts it."""


def _attempt_id() -> str:
    """This task attempt's id, unique in the application (Spark's task attempt id)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return f"local-{os.getpid()}-{time.monotonic_ns()}"
    return f"task-{ctx.taskAttemptId()}"


class TesseraWriter(DataSourceArrowWriter):
    def __init__(self, opts: ReadOptions, schema_version: int, txn_id: int = 0) -> None:
        self.opts = opts
        self.schema_version = schema_version
        self.txn_id = txn_id
        """The write's transaction (atomic writes); 0: rows are written as they come."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TesseraCommit:
        opts = self.opts
        client = opts.client()
        info: TableHandle = client.call("open_table", opts.table)
        target = info.schema.to_arrow()
        attempt = _attempt_id() if self.txn_id else ""
        session = client.call(
            "new_session",
            opts.table,
            timeout=opts.rpc_timeout_s,
            txn_id=self.txn_id,
            txn_attempt=attempt,
        )
        # Keep-alives while this task runs (the driver's process may be gone).
        alive = (
            client.run(client.client.attach_transaction(self.txn_id, WRITE_KEEPALIVE_MS / 1000))
            if self.txn_id
            else None
        )
        try:
            for b in iterator:
                if b.num_rows:
                    client.run(session.apply(_conform(b, target, opts.table), opts.operation))
            client.run(session.flush())
        finally:
            if alive is not None:
                alive.stop_keepalive()
        total = session.result
        if total.errors and opts.row_errors == "fail":
            raise InvalidArgument(
                f"tessera {opts.operation} into table {opts.table!r}: "
                + format_errors(total.errors)
            )
        return TesseraCommit(
            rows_applied=total.rows_applied,
            rows_failed=len(total.errors),
            error_samples=[str(e) for e in total.errors[:5]],
            attempt=attempt,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.txn_id:
            self.commit_transaction(messages)
        self.report(messages)

    def commit_transaction(self, messages: list[WriterCommitMessage | None]) -> int:
        """Commit the write's transaction with exactly the attempts of `messages` (and the
        truncate's deletes); the commit timestamp. Raises (failing the job) if it aborted."""
        kept = ["truncate"] + [m.attempt for m in messages if isinstance(m, TesseraCommit)]
        client = self.opts.client()
        txn = client.run(client.client.attach_transaction(self.txn_id))
        ts: int = client.run(txn.commit(kept))
        log.info("tessera write to %r: transaction %d committed", self.opts.table, self.txn_id)
        return ts

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """The job failed: abort its transaction, so none of its rows ever shows."""
        if self.txn_id:
            _abort(self.opts, self.txn_id, "the Spark write failed")

    def report(self, messages: list[WriterCommitMessage | None]) -> None:
        applied = sum(m.rows_applied for m in messages if isinstance(m, TesseraCommit))
        failed = sum(m.rows_failed for m in messages if isinstance(m, TesseraCommit))
        samples = [s for m in messages if isinstance(m, TesseraCommit) for s in m.error_samples]
        if failed:
            log.warning(
                "tessera write to %r: %d rows applied, %d refused: %s",
                self.opts.table,
                applied,
                failed,
                "; ".join(samples[:5]),
            )
        else:
            log.info("tessera write to %r: %d rows applied", self.opts.table, applied)


def _conform(batch: pa.RecordBatch, target: pa.Schema, table: str) -> pa.Table:
    """`batch` with each column cast to the table's Arrow type (checked: overflow is an error
    naming the column)."""
    cols = []
    for name, arr in zip(batch.schema.names, batch.columns, strict=True):
        want = target.field(name).type
        if arr.type != want:
            try:
                arr = arr.cast(want, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise InvalidArgument(
                    f"column {name!r} of table {table!r}: cannot convert {arr.type} to {want}: {e}"
                ) from None
        cols.append(arr)
    return pa.Table.from_arrays(cols, names=batch.schema.names)


# --- registration ----------------------------------------------------------------------------


def register(spark: Any) -> None:
    """Make `format("tessera")` and `USING tessera` known to `spark` (idempotent)."""
    spark.dataSource.register(TesseraDataSource)


def register_views(spark: Any, masters: str | Sequence[str], **options: str) -> list[str]:
    """Register every Tessera table as a temporary view of the same name; the names.
    `options` are passed to each view (`credentials` included)."""
    register(spark)
    addrs = masters if isinstance(masters, str) else ",".join(masters)
    client = SyncClient.shared(
        tuple(a.strip() for a in addrs.split(",") if a.strip()),
        credentials=find_credentials(options.get("credentials")),
    )
    names = []
    for t in client.call("list_tables"):
        reader = spark.read.format(FORMAT).option("masters", addrs).option("table", t.name)
        for k, v in options.items():
            reader = reader.option(k, v)
        reader.load().createOrReplaceTempView(t.name)
        names.append(t.name)
    return names
