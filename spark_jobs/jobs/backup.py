"""Backups of a Tessera table as a Delta table: a full backup, then incremental ones, each one
Delta commit; a reader folds the chain.

    spark-submit spark_jobs/jobs/backup.py --masters HOST:PORT,... --table T --dest PATH
    tessera jobs run backup --dir DIR --table T --dest PATH [--full] [--as-of TIME]

Theory of operation
-------------------
A backup reads the table as one snapshot (docs/design/tablets.md#R3): every tablet at the same
hybrid timestamp T, so the copy is the table as it was at T, whatever was being written. The
Delta table at PATH holds a backup *chain* (docs/design/tablets.md#R7), one Delta version per
backup. Besides the table's columns it has two of ours, first (so that Delta keeps min/max
statistics of them whatever the table's width, and skips files by them): `_tessera_backup_ts`,
the hybrid timestamp of the backup that wrote the row, and `_tessera_deleted`.

* The first run (or `--full`) writes the whole snapshot as a Delta overwrite: every row, with
  ts = T and deleted = false. It starts a new chain; the versions before it stay readable
  until a Delta VACUUM removes their files.
* Every later run reads only what changed since the previous backup's timestamp, a diff scan
  of (T_prev, T] (each changed key as it is at T, deleted keys flagged), and APPENDS those rows
  with ts = T: one Delta commit that adds files and rewrites none.

So a version of the Delta table is not the table at that backup; it is the chain up to it.
`read_backup(spark, PATH, N)` folds it into the table as of backup N: the full backup's rows,
less every key a later backup of the chain changed, plus each such key's newest version unless
that is a deletion. `restore` (spark_jobs/jobs/restore.py) writes that back into a cluster.

Why a chain and not one MERGE per incremental (what this job did before; Kudu's backups are a
chain the restore folds too): with 1% of 3 million rows changed at random, the MERGE took 15 s
of a 17 s incremental, longer than a fifth of the 18-22 s full backup, and the diff scan itself
about 1 s. Half of the MERGE was joining the changed keys against every row of the backup, the
rest copying the untouched rows of every file a changed key lay in, which with random changes
is every file. Deletion vectors spared the copy but not the join (the MERGE took longer still),
and Delta 4.x then refuses a DataSource V2 write of such a table's rows, which restore does. An
append costs what the diff costs; the fold moves the join to restore, where it is a broadcast
anti join of the few changed keys against the full backup, paid once per restore.

Each commit carries, in its `userMetadata`, a `BackupInfo` (JSON, format `FORMAT`): the table's
name, schema and partitioning (as the master's protobuf forms, base64), its replica count, the
backup's kind and hybrid timestamp, the previous one's and the chain's full backup's. A Delta
table written by the MERGE-era job (format 1) is refused, naming `--full`, which starts a new
chain over it. An incremental run needs the previous timestamp to be within
`tablet_history_max_age` (the diff reads history); older, it fails with SNAPSHOT_TOO_OLD and
`--full` starts a new chain. A table whose schema changed since the last backup also needs
`--full`. A long chain makes restores slower (they fold every change since the full backup):
start a new one with `--full` now and then.

Exit codes: 0 done, 1 error. The last line is one summary:
`backup: TABLE full at TIME: N rows -> PATH version V in S s`, or for an incremental
`backup: TABLE incremental at TIME: N rows (C changed, D deleted) -> PATH version V in S s`
(N rows appended: C keys inserted or updated, D deleted, since the previous backup).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from service.client.sync import SyncClient
from service.common.errors import Aborted, InvalidArgument, NotFound, TesseraError
from service.common.hybrid_time import describe
from service.common.predicates import IS_DELETED
from service.common.schema import Schema
from service.common.schema_codec import partition_schema_to_pb, schema_from_pb, schema_to_pb
from service.pb import common_pb2
from spark_jobs import delta_log

__all__ = ["BACKUP_TS", "DELETED", "FORMAT", "BackupInfo", "backup", "last_backup", "main"]
__all__ += ["read_backup"]

JOB = "backup"

FORMAT = 2
"""The `tessera_backup` marker of a commit's metadata: 1 was one MERGE per incremental (each
version the table itself), 2 the chain of appends this module writes."""
CHAIN_APP_ID = "tessera-backup-chain"
"""Delta transaction id (`txnAppId`) of incremental backups: each names the Delta version after
the backup it extends (`txnVersion`), so two incrementals of one chain never both land."""

BACKUP_TS = "_tessera_backup_ts"
"""Our column: the hybrid timestamp of the backup that wrote the row (LONG)."""
DELETED = "_tessera_deleted"
"""Our column: the row is a deletion of its key (BOOLEAN; only incremental backups write true)."""


@dataclass(frozen=True)
class BackupInfo:
    """What one backup's Delta commit says of it (its `userMetadata`, JSON)."""

    table: str
    kind: str
    """"full" or "incremental"."""
    snapshot_timestamp: int
    """The hybrid timestamp the backup read the table at."""
    previous_timestamp: int
    """The previous backup's timestamp (0 for a full one): the diff covered (previous, this]."""
    chain_timestamp: int
    """The chain's full backup's timestamp: the rows with it are the chain's base."""
    schema: str
    """SchemaPB, serialized, base64."""
    partition_schema: str
    """PartitionSchemaPB, serialized, base64."""
    schema_version: int
    num_replicas: int

    def to_json(self) -> str:
        return json.dumps({"tessera_backup": FORMAT, **asdict(self)}, sort_keys=True)

    @staticmethod
    def from_json(text: str | None, where: str) -> BackupInfo:
        """The info of a commit's `userMetadata`; InvalidArgument (naming `where`) when it is
        not a backup's, or one of another format."""
        try:
            d = json.loads(text) if text else None
        except ValueError:
            d = None
        marker = d.get("tessera_backup") if isinstance(d, dict) else None
        if marker is None:
            raise InvalidArgument(f"{where}: not a Tessera backup (no backup metadata)")
        if marker != FORMAT:
            raise InvalidArgument(
                f"{where}: a backup in format {marker}, which this Tessera does not read (format "
                f"{FORMAT} is a chain of appends; format 1 merged each incremental backup into "
                "the table): run backup with --full to start a new chain there"
            )
        assert isinstance(d, dict)
        d.pop("tessera_backup")
        try:
            return BackupInfo(**d)
        except TypeError as e:
            raise InvalidArgument(f"{where}: malformed backup metadata ({e})") from None

    def table_schema(self) -> Schema:
        """The backed-up table's schema (decoded from `schema`)."""
        return schema_from_pb(common_pb2.SchemaPB.FromString(base64.b64decode(self.schema)))


def last_backup(
    spark: Any, path: str, version: int | None = None
) -> tuple[int, BackupInfo, dict[str, str]] | None:
    """(Delta version, info, Delta's operation metrics) of the newest backup in the Delta table
    at `path`, or of backup `version`; None when `path` holds no Delta table. InvalidArgument
    when that version is no backup, or one of another format (`BackupInfo.from_json`)."""
    from delta.tables import DeltaTable

    local = delta_log.local_dir(path)
    if local is not None and (local / "_delta_log").is_dir():
        # Straight from the commit file, without a Spark job (delta_log.commit).
        c = delta_log.commit(local, version)
        if c is not None:
            info = BackupInfo.from_json(c.info.get("userMetadata"), f"{path} version {c.version}")
            metrics = {k: str(m) for k, m in (c.info.get("operationMetrics") or {}).items()}
            return c.version, info, metrics
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    hist = (
        DeltaTable.forPath(spark, path)
        .history()
        .select("version", "userMetadata", "operationMetrics")
    )
    if version is not None:
        hist = hist.where(f"version = {int(version)}")
    rows = hist.orderBy("version", ascending=False).limit(1).collect()
    if not rows:
        raise InvalidArgument(f"{path}: no Delta version {version}")
    v = int(rows[0]["version"])
    info = BackupInfo.from_json(rows[0]["userMetadata"], f"{path} version {v}")
    return v, info, dict(rows[0]["operationMetrics"] or {})


def read_backup(spark: Any, path: str, version: int | None = None) -> Any:
    """The backed-up table as of backup `version` of the Delta table at `path` (the newest if
    None), as a DataFrame of exactly the table's columns: the chain up to that version, folded
    (module docstring). NotFound when `path` holds no Delta table; InvalidArgument when the
    version is no backup of this format."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    found = last_backup(spark, path, version)
    if found is None:
        raise NotFound(f"{path}: no Delta table (no backups there)")
    v, info, _ = found
    schema = info.table_schema()
    columns = list(schema.column_names)
    df = spark.read.format("delta").option("versionAsOf", v).load(path)
    missing = [c for c in (*columns, BACKUP_TS, DELETED) if c not in df.columns]
    if missing:
        raise InvalidArgument(f"{path} version {v}: the backup has no columns {missing}")
    if info.kind == "full":
        return df.select(*_cols(columns))
    keys = [c.name for c in schema.key_columns]
    ts = F.col(BACKUP_TS)
    base = df.where(ts == info.chain_timestamp)
    # The changes are the few rows the chain's incremental backups appended; each key's newest
    # one decides it. Key columns are NOT NULL (a schema refuses nullable keys), so plain
    # equality is exact. The changed keys are renamed, so that the join of two halves of one
    # DataFrame names each side's columns unambiguously.
    newest = Window.partitionBy(*(_col(k) for k in keys)).orderBy(ts.desc())
    latest = (
        df.where(ts > info.chain_timestamp)
        .withColumn("_tessera_rank", F.row_number().over(newest))
        .where(F.col("_tessera_rank") == 1)
    )
    changed = latest.select(*(_col(k).alias(f"_tessera_key{i}") for i, k in enumerate(keys)))
    on = [_col(k) == F.col(f"_tessera_key{i}") for i, k in enumerate(keys)]
    kept = base.join(F.broadcast(changed), on=on, how="left_anti")
    live = latest.where(~F.col(DELETED))
    return kept.select(*_cols(columns)).unionByName(live.select(*_cols(columns)))


def _col(name: str) -> Any:
    """The column `name`, quoted: a Tessera column's name may hold dots or backticks."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _cols(names: Sequence[str]) -> list[Any]:
    return [_col(n) for n in names]


def _say(text: str) -> None:
    print(f"{JOB}: {text}", flush=True)


def backup(
    spark: Any,
    client: SyncClient,
    masters: Sequence[str],
    table: str,
    dest: str,
    *,
    credentials_dir: str | None = None,
    full: bool = False,
    at: int | None = None,
) -> tuple[int, BackupInfo, dict[str, int]]:
    """Back `table` up into the Delta table at `dest` (module docstring). Returns the Delta
    version written, its metadata and counts: `rows` written, of which `changed` (inserted or
    updated keys; every row of a full backup) and `deleted`."""
    from pyspark.sql import functions as F

    handle = client.call("open_table", table)
    schema = handle.schema
    ours = [c for c in (BACKUP_TS, DELETED) if schema.has_column(c)]
    if ours:
        raise InvalidArgument(
            f"table {table!r} has columns named {ours}, which a backup adds: rename them first"
        )
    at = at or client.client.snapshot_now()
    # Even --full looks at what is there: a Delta table that is no backup, or that holds
    # another table's backups, is refused rather than overwritten (an old-format chain of this
    # table may be: --full is how one moves on from it).
    if full:
        previous = None
        backed_up = _backed_up_table(spark, dest)
    else:
        previous = last_backup(spark, dest)
        backed_up = previous[1].table if previous is not None else None
    if backed_up is not None and backed_up != table:
        raise InvalidArgument(f"{dest} holds backups of table {backed_up!r}, not {table!r}")
    if previous is not None:
        prev_info = previous[1]
        if prev_info.schema_version != schema.version:
            raise InvalidArgument(
                f"table {table!r} is at schema version {schema.version}, the last backup in "
                f"{dest} at {prev_info.schema_version}: run with --full to start a new chain"
            )
        if prev_info.snapshot_timestamp >= at:
            raise InvalidArgument(
                f"the last backup in {dest} is at {describe(prev_info.snapshot_timestamp)}, "
                f"not before {describe(at)}"
            )
    info = BackupInfo(
        table=table,
        kind="incremental" if previous is not None else "full",
        snapshot_timestamp=at,
        previous_timestamp=previous[1].snapshot_timestamp if previous is not None else 0,
        chain_timestamp=previous[1].chain_timestamp if previous is not None else at,
        schema=base64.b64encode(schema_to_pb(schema).SerializeToString()).decode(),
        partition_schema=base64.b64encode(
            partition_schema_to_pb(handle.partition_schema, schema).SerializeToString()
        ).decode(),
        schema_version=schema.version,
        num_replicas=handle.num_replicas,
    )
    reader = (
        spark.read.format("tessera")
        .option("masters", ",".join(masters))
        .option("table", table)
        .option("snapshot_hybrid_time", str(at))
    )
    if credentials_dir:
        reader = reader.option("credentials", credentials_dir)
    _say(f"{info.kind} backup of {table!r} at {describe(at)} into {dest}")
    stamp = F.lit(at).cast("long").alias(BACKUP_TS)
    if previous is None:
        _say("writing the snapshot")
        rows = reader.load().select(stamp, F.lit(False).alias(DELETED), *_cols(schema.column_names))
        writer = rows.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
    else:
        _say(f"appending the rows changed since {describe(info.previous_timestamp)}")
        reader = reader.option("diff_start_hybrid_time", str(info.previous_timestamp))
        diff = reader.load()  # a deleted key's other columns are null: declared nullable
        rows = diff.select(stamp, F.col(IS_DELETED).alias(DELETED), *_cols(schema.column_names))
        if delta_log.local_dir(dest) is None:
            # Kept while it is written, so that its deletions are counted from the rows
            # written without a second diff scan or a read of the Delta table back (13 s of a
            # 17 s incremental backup of a million rows, against 2.3 s for the write itself).
            # A local table's are counted from the files the commit added instead.
            rows = rows.persist()
        # One chain, one writer at a time: the append names the backup it extends (Delta's
        # idempotent-write transaction id). Of two incrementals begun from the same backup,
        # the second to commit conflicts (ConcurrentTransactionException) or, if the first
        # had already committed when it began its commit, is skipped by Delta; either way it
        # is refused below rather than leave two diffs of overlapping spans in the chain.
        writer = (
            rows.write.format("delta")
            .mode("append")
            .option("txnAppId", CHAIN_APP_ID)
            .option("txnVersion", str(previous[0] + 1))
        )
    try:
        try:
            writer.option("userMetadata", info.to_json()).save(dest)
        except Exception as e:
            if "ConcurrentTransaction" not in f"{type(e).__name__} {e}":
                raise
            raise _raced(dest, table) from None
        written = last_backup(spark, dest)
        assert written is not None
        version, winfo, metrics = written
        if winfo.snapshot_timestamp != at:
            raise _raced(dest, table)  # Delta skipped our append: another one took its place
        n = int(metrics.get("numOutputRows", "0"))
        if previous is None:
            return version, info, {"rows": n, "changed": n, "deleted": 0}
        deleted = _deleted_in(dest, version)
        if deleted is None:
            deleted = rows.where(F.col(DELETED)).count()
        return version, info, {"rows": n, "changed": n - deleted, "deleted": deleted}
    finally:
        if previous is not None and rows.is_cached:
            rows.unpersist()


def _raced(dest: str, table: str) -> Aborted:
    return Aborted(
        f"another backup of {table!r} into {dest} committed first, from the same previous "
        "backup; nothing was written: run the backup again"
    )


def _deleted_in(path: str, version: int) -> int | None:
    """The deletions backup `version` of a local Delta table wrote, counted in the Parquet
    files its commit added (one boolean column each); None when the table is not local or its
    commit is not readable here (delta_log.commit), and Spark counts them."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    local = delta_log.local_dir(path)
    c = delta_log.commit(local, version) if local is not None else None
    if c is None:
        return None
    return sum(
        int(pc.sum(pq.read_table(f, columns=[DELETED]).column(DELETED)).as_py() or 0)
        for f in c.added
    )


def _backed_up_table(spark: Any, path: str) -> str | None:
    """The table whose backups the Delta table at `path` holds, by its newest commit, in any
    format; None when there is no Delta table. InvalidArgument when it is no backup."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    rows = DeltaTable.forPath(spark, path).history(1).select("userMetadata").collect()
    try:
        d = json.loads(rows[0]["userMetadata"] or "null") if rows else None
    except ValueError:
        d = None
    if not isinstance(d, dict) or "tessera_backup" not in d or not isinstance(d.get("table"), str):
        raise InvalidArgument(
            f"{path}: a Delta table that is not a Tessera backup: back up into another path"
        )
    return str(d["table"])


def cluster_parser(job: str, description: str) -> argparse.ArgumentParser:
    """The arguments backup and restore share: the cluster, its credentials, the warehouse."""
    p = argparse.ArgumentParser(prog=f"tessera jobs run {job}", description=description)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--masters", help="master addresses host:port[,host:port...]")
    src.add_argument("--dir", help="a local cluster's directory (tessera cluster up --dir)")
    p.add_argument("--credentials", metavar="DIR", help="a secured cluster's credentials")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per cluster call")
    p.add_argument("--warehouse", metavar="DIR", help="the Spark SQL warehouse directory")
    return p


def run_cluster_job(
    job: str,
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    body: Callable[[argparse.Namespace, Any, SyncClient, list[str], str | None], str],
) -> int:
    """Parse, start Spark (before any client: a JVM forked beside gRPC threads fails), open a
    client of the cluster, run `body`, print the one summary line it returns. Exit codes: 0
    done, 1 error (one clear line)."""
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return 1 if e.code else 0
    try:
        from service.client.credentials import find_credentials
        from spark_jobs.session import build_session, require_delta

        spark = build_session(f"tessera-{job}", warehouse_dir=args.warehouse)
        require_delta(spark, f"tessera jobs run {job}")
        masters, creds_dir = cluster_args(args)
        t0 = time.monotonic()
        with SyncClient(
            masters, timeout=args.timeout, credentials=find_credentials(creds_dir)
        ) as client:
            summary = body(args, spark, client, masters, creds_dir)
        print(f"{job}: {summary} in {time.monotonic() - t0:.1f} s")
        return 0
    except TesseraError as e:
        print(f"{job}: {e.message}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        from spark_jobs.session import SparkSessionError

        if not isinstance(e, SparkSessionError):
            raise
        print(f"{job}: {e}", file=sys.stderr)
        return 1


def cluster_args(args: argparse.Namespace) -> tuple[list[str], str | None]:
    """(master addresses, credentials directory) of a job's --masters/--dir/--credentials."""
    import os
    from pathlib import Path

    from service.client.credentials import ENV_VAR

    if args.masters:
        masters = [a.strip() for a in args.masters.split(",") if a.strip()]
    else:
        from service.tools.local_cluster import master_addresses

        masters = master_addresses(args.dir)
    creds = args.credentials
    if not creds and args.dir and (Path(args.dir) / "credentials").is_dir():
        creds = str(Path(args.dir).resolve() / "credentials")
    return masters, creds or os.environ.get(ENV_VAR) or None


def _run(
    args: argparse.Namespace,
    spark: Any,
    client: SyncClient,
    masters: list[str],
    creds_dir: str | None,
) -> str:
    from service.tools.admin_cmd import parse_as_of

    at = parse_as_of(args.as_of) if args.as_of else None
    version, info, counts = backup(
        spark,
        client,
        masters,
        args.table,
        args.dest,
        credentials_dir=creds_dir,
        full=args.full,
        at=at,
    )
    change = f"{counts['rows']} rows"
    if info.kind == "incremental":
        change += f" ({counts['changed']} changed, {counts['deleted']} deleted)"
    return (
        f"{args.table} {info.kind} at {describe(info.snapshot_timestamp)}: {change} -> "
        f"{args.dest} version {version}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = cluster_parser(JOB, __doc__ or JOB)
    p.add_argument("--table", required=True, help="the table to back up")
    p.add_argument("--dest", required=True, help="the Delta table (a path) holding its backups")
    p.add_argument("--full", action="store_true", help="a full backup, starting a new chain")
    p.add_argument(
        "--as-of",
        metavar="TIME",
        help="back up the table as of TIME (ISO 8601, ms since the epoch, or now; default now)",
    )
    return run_cluster_job(JOB, p, argv, _run)


if __name__ == "__main__":
    sys.exit(main())
