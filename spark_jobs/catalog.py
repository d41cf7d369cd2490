"""Where the jobs' table names live: a catalog per session by default, a Hive metastore on request.

Theory of operation
-------------------
Spark's catalog maps a name (`tessera_audit.tables`) to a table's location. Hive's catalog
keeps that map in a metastore database, and Spark's built-in one is an embedded Derby database
that a single JVM at a time may open: a job started while another runs gets "Another instance
of Derby may have already booted the database" (and thousands of lines of stack traces), and
its catalog calls can fail. So Tessera sessions use Spark's in-memory catalog by default
(`spark.sql.catalogImplementation in-memory`, conf/spark-defaults.conf): one per session,
nothing shared between processes, nothing to fight over.

The tables themselves stay where a Hive managed table would be,
`<warehouse>/<database>.db/<table>`, and are Delta tables, which keep everything about
themselves (schema, versions, change data feed, properties) in their own `_delta_log`: a
catalog entry is only a name for a path. So a session's catalog is rebuilt from the warehouse:
`register_tables` (which `build_session` runs) lists the warehouse and registers every Delta
table there under its name as an external table (``CREATE TABLE IF NOT EXISTS db.t USING delta
LOCATION ...``); `VERSION AS OF`, `TIMESTAMP AS OF`, `DESCRIBE HISTORY` and
`table_changes('db.t', ...)` then work by name as before. A writer creates a new table at its
path and then registers it (`append`), so a table another process created after this session
started is simply appended to. Two processes writing one table meet only in Delta's optimistic
concurrency, made for concurrent writers: a commit that conflicts fails with a
concurrent-modification error and the idempotent writers here try again (`retry_on_conflict`).
See https://docs.delta.io/latest/concurrency-control.html.

A Hive metastore is used when one is configured: `spark.sql.catalogImplementation hive` set by
spark-submit's ``--conf``, the installation's spark-defaults.conf or the caller's conf;
`--metastore DIR` (Derby in DIR, so one process at a time per DIR); or a setting that names a
metastore without choosing the catalog (`spark.hadoop.hive.metastore.uris`, a network metastore
service that any number of jobs share, or a JDBC `javax.jdo.option.ConnectionURL`):
`hive_requested`. The tables are then registered in that metastore as they are created, and
`register_tables` leaves the catalog alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

__all__ = [
    "CATALOG_IMPLEMENTATION",
    "append",
    "ensure_database",
    "hive_requested",
    "is_conflict",
    "register",
    "register_tables",
    "retry_on_conflict",
    "table_path",
    "uses_hive",
]

CATALOG_IMPLEMENTATION = "spark.sql.catalogImplementation"

# Settings that only mean something to a Hive metastore: naming one asks for Hive's catalog.
_HIVE_SETTINGS = (
    "spark.hadoop.hive.metastore.uris",
    "spark.hadoop.javax.jdo.option.ConnectionURL",
    "spark.sql.hive.metastore.",
)

# Error conditions of a Delta commit that lost a race with another writer (Delta's
# DeltaConcurrentModificationException family), and of creating a table another writer has
# just created: all mean "look again and retry".
_CONFLICT_CONDITIONS = (
    "DELTA_CONCURRENT_",
    "DELTA_METADATA_CHANGED",
    "DELTA_PROTOCOL_CHANGED",
    "DELTA_PATH_EXISTS",
    "DELTA_TABLE_ALREADY_EXISTS",
    "TABLE_OR_VIEW_ALREADY_EXISTS",
    "LOCATION_ALREADY_EXISTS",
)

T = TypeVar("T")


def hive_requested(settings: Mapping[str, str]) -> bool:
    """Whether `settings` (what the caller or the launcher chose) name a Hive metastore."""
    return settings.get(CATALOG_IMPLEMENTATION) == "hive" or any(
        key.startswith(_HIVE_SETTINGS) and value for key, value in settings.items()
    )


def uses_hive(spark: Any) -> bool:
    """Whether the session's catalog is a Hive metastore (else it is the in-memory one)."""
    return str(spark.conf.get(CATALOG_IMPLEMENTATION, "in-memory")) == "hive"


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def ensure_database(spark: Any, database: str) -> None:
    """CREATE DATABASE IF NOT EXISTS, quietly: Spark logs a warning whenever the database's
    directory exists already, which with a catalog per session is every session but the
    first."""
    if not spark.catalog.databaseExists(database):
        spark.sql(f"CREATE DATABASE IF NOT EXISTS {_quote(database)}")


def _database_path(spark: Any, database: str) -> str:
    ensure_database(spark, database)
    return str(spark.catalog.getDatabase(database).locationUri).rstrip("/")


def table_path(spark: Any, database: str, table: str) -> str:
    """Where `database.table` lives, or will: `<database location>/<table>`, the place of a
    managed table in either catalog (the database is created if need be)."""
    return f"{_database_path(spark, database)}/{table}"


def _escape(text: str) -> str:
    """`text` inside a single-quoted SQL string literal."""
    return text.replace("\\", "\\\\").replace("'", "\\'")


def register(spark: Any, database: str, table: str, path: str) -> None:
    """Name the Delta table at `path` `database.table` in the session's catalog (no-op when
    the name exists)."""
    ensure_database(spark, database)
    spark.sql(
        f"CREATE TABLE IF NOT EXISTS {_quote(database)}.{_quote(table)} USING delta "
        f"LOCATION '{_escape(path)}'"
    )


def register_tables(
    spark: Any, database: str | None = None, known: Iterable[str] = ()
) -> list[str]:
    """Register the Delta tables of the warehouse (of `database` only, if given) that the
    session's in-memory catalog lacks; the names registered. Nothing under a Hive metastore,
    which keeps its own.

    A classic session lists the warehouse through Hadoop's FileSystem (any URI the warehouse
    may have): `<db>.db/<table>/_delta_log` is `db.table`, `<table>/_delta_log` is
    `default.table`. A Spark Connect client cannot list the server's files, so there only the
    `known` tables of `database` are looked for (a path that is no Delta table makes
    DESCRIBE HISTORY fail, and is skipped)."""
    if uses_hive(spark):
        return []
    jvm = getattr(spark, "_jvm", None)
    found = (
        _list_delta_tables(spark, jvm, database)
        if jvm is not None
        else _probe(spark, database, known)
    )
    registered = []
    for db, table, path in found:
        try:
            register(spark, db, table, path)
        except Exception as exc:
            # Another process is creating it (its first commit not yet complete, or lost):
            # named next time. Anything else is a real problem.
            if not _no_table_yet(exc):
                raise
            continue
        registered.append(f"{db}.{table}")
    return registered


def _named(spark: Any, database: str) -> set[str]:
    """The tables the session's catalog names in `database` (none if it does not know it)."""
    if not spark.catalog.databaseExists(database):
        return set()
    return {r.tableName for r in spark.sql(f"SHOW TABLES IN {_quote(database)}").collect()}


def _list_delta_tables(spark: Any, jvm: Any, database: str | None) -> list[tuple[str, str, str]]:
    """(database, table, path) of each Delta table in the warehouse the catalog lacks."""
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(str(spark.conf.get("spark.sql.warehouse.dir")))
    fs = root.getFileSystem(hadoop)
    if not fs.isDirectory(root):
        return []

    def is_delta(directory: Any) -> bool:
        # A table has a commit (or a checkpoint) in its log: a bare _delta_log is a table
        # another process is creating right now.
        log = jvm.org.apache.hadoop.fs.Path(directory, "_delta_log")
        return bool(fs.exists(log)) and any(
            str(s.getPath().getName()).endswith((".json", ".parquet", "_last_checkpoint"))
            for s in fs.listStatus(log)
        )

    def delta_tables(directory: Any, db: str) -> list[tuple[str, str, str]]:
        named = _named(spark, db)  # only those the catalog lacks are looked into
        return sorted(
            (db, str(s.getPath().getName()), str(s.getPath().toUri().toString()))
            for s in fs.listStatus(directory)
            if s.isDirectory() and s.getPath().getName() not in named and is_delta(s.getPath())
        )

    default_named = _named(spark, "default")
    found: list[tuple[str, str, str]] = []
    for status in sorted(fs.listStatus(root), key=lambda s: str(s.getPath().getName())):
        name = str(status.getPath().getName())
        if not status.isDirectory() or name.startswith((".", "_")):
            continue
        if name.endswith(".db"):
            db = name.removesuffix(".db").lower()
            if database is None or db == database:
                found += delta_tables(status.getPath(), db)
        elif (
            database in (None, "default")
            and name not in default_named
            and is_delta(status.getPath())
        ):
            found.append(("default", name, str(status.getPath().toUri().toString())))
    return found


def _probe(spark: Any, database: str | None, known: Iterable[str]) -> list[tuple[str, str, str]]:
    if database is None:
        return []
    # Where the database's directory is, without creating it (there may be nothing to name).
    named = _named(spark, database)
    if spark.catalog.databaseExists(database):
        base = _database_path(spark, database)
    else:
        warehouse = str(spark.conf.get("spark.sql.warehouse.dir")).rstrip("/")
        base = f"{warehouse}/{database}.db"
    found = []
    for table in known:
        if table in named:
            continue
        path = f"{base}/{table}"
        try:
            spark.sql(f"DESCRIBE HISTORY delta.{_quote(path)} LIMIT 1").collect()
        except Exception:  # no Delta table there (yet)
            continue
        found.append((database, table, path))
    return found


def _no_table_yet(exc: BaseException) -> bool:
    """A location that holds no complete Delta table (yet): Delta's errors for it."""
    text = str(exc)
    return any(
        c in text
        for c in ("DELTA_MISSING_DELTA_TABLE", "DELTA_SCHEMA_NOT_PROVIDED", "is not a Delta table")
    )


def append(spark: Any, writer: Any, database: str, table: str) -> None:
    """Append with `writer` (a DataFrameWriter with format "delta", mode and options set) to
    `database.table`: by name when the catalog has it; else at its warehouse path, which
    creates the table or appends to one another process created meanwhile, then registered."""
    name = f"{_quote(database)}.{_quote(table)}"
    if spark.catalog.tableExists(f"{database}.{table}"):
        writer.saveAsTable(name)
        return
    path = table_path(spark, database, table)
    writer.save(path)
    register(spark, database, table, path)


def is_conflict(exc: BaseException) -> bool:
    """Whether `exc` is a Delta commit that lost to a concurrent writer, or a table creation
    that another writer got to first (module docstring)."""
    from delta.exceptions import DeltaConcurrentModificationException

    if isinstance(exc, DeltaConcurrentModificationException):
        return True
    get = getattr(exc, "getCondition", None)
    condition = get() if callable(get) else None
    if condition and str(condition).startswith(_CONFLICT_CONDITIONS):
        return True
    return any(c in str(exc) for c in _CONFLICT_CONDITIONS)


def retry_on_conflict(action: Callable[[], T], attempts: int = 6) -> T:
    """Run `action` (which must be idempotent: the audit writers are), again after a short
    pause each time it loses a race with another writer (`is_conflict`)."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == attempts or not is_conflict(exc):
                raise
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")  # pragma: no cover
