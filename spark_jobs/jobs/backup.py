"""Backups of a Tessera table as a Delta table: full, then incremental, each one Delta commit.

    spark-submit spark_jobs/jobs/backup.py --masters HOST:PORT,... --table T --dest PATH
    tessera jobs run backup --dir DIR --table T --dest PATH [--full] [--as-of TIME]

Theory of operation
-------------------
A backup reads the table as one snapshot (docs/design/tablets.md#R3): every tablet at the same
hybrid timestamp T, so the copy is the table as it was at T, whatever was being written. The
Delta table at PATH is the backup chain, one Delta version per backup:

* the first run (or `--full`) writes the whole snapshot as a Delta overwrite;
* every later run reads only what changed since the previous backup's timestamp, a diff scan
  of (T_prev, T] (each changed key as it is at T, deleted keys flagged), and applies it with one
  Delta MERGE on the primary key: deleted keys are deleted, the others updated or inserted.

Each commit carries, in its `userMetadata`, the table's name, schema and partitioning (as the
master's protobuf forms, base64), its replica count, the backup's kind and hybrid timestamp and
the previous one's (`BackupInfo`). So `VERSION AS OF N` of the Delta table is the table as of
backup N, and `restore` (spark_jobs/jobs/restore.py) recreates it from any version. An
incremental run needs the previous timestamp to be within `tablet_history_max_age` (the diff
reads history); older, it fails with SNAPSHOT_TOO_OLD and `--full` starts a new chain. A table
whose schema changed since the last backup also needs `--full`.

Exit codes: 0 done, 1 error. The last line is one summary:
`backup: TABLE full|incremental at TIME: N rows (+I ~U -D) -> PATH version V in S s`.
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
from service.common.errors import InvalidArgument, TesseraError
from service.common.hybrid_time import describe
from service.common.predicates import IS_DELETED
from service.common.schema_codec import partition_schema_to_pb, schema_to_pb

__all__ = ["BackupInfo", "backup", "last_backup", "main"]

JOB = "backup"


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
    schema: str
    """SchemaPB, serialized, base64."""
    partition_schema: str
    """PartitionSchemaPB, serialized, base64."""
    schema_version: int
    num_replicas: int

    def to_json(self) -> str:
        return json.dumps({"tessera_backup": 1, **asdict(self)}, sort_keys=True)

    @staticmethod
    def from_json(text: str | None) -> BackupInfo | None:
        if not text:
            return None
        try:
            d = json.loads(text)
        except ValueError:
            return None
        if not isinstance(d, dict) or d.pop("tessera_backup", None) != 1:
            return None
        return BackupInfo(**d)


def last_backup(
    spark: Any, path: str, version: int | None = None
) -> tuple[int, BackupInfo, dict[str, str]] | None:
    """(Delta version, info, Delta's operation metrics) of the newest backup in the Delta table
    at `path`, or of backup `version`; None when `path` holds no Delta table."""
    from delta.tables import DeltaTable

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
    info = BackupInfo.from_json(rows[0]["userMetadata"])
    if info is None:
        raise InvalidArgument(
            f"{path} version {rows[0]['version']}: not a Tessera backup (no backup metadata)"
        )
    return int(rows[0]["version"]), info, dict(rows[0]["operationMetrics"] or {})


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
    version written, its metadata and counts (rows written, or inserted/updated/deleted)."""
    handle = client.call("open_table", table)
    schema = handle.schema
    at = at or client.client.snapshot_now()
    previous = None if full else last_backup(spark, dest)
    if previous is not None:
        prev_info = previous[1]
        if prev_info.table != table:
            raise InvalidArgument(
                f"{dest} holds backups of table {prev_info.table!r}, not {table!r}"
            )
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
    if previous is None:
        _say("writing the snapshot")
        (
            reader.load()
            .write.format("delta")
            .mode("overwrite")
            .option("overwriteSchema", "true")
            .option("userMetadata", info.to_json())
            .save(dest)
        )
    else:
        _say(f"merging the rows changed since {describe(info.previous_timestamp)}")
        diff = reader.option("diff_start_hybrid_time", str(info.previous_timestamp)).load()
        _merge(spark, dest, diff, [c.name for c in schema.key_columns], info)
    written = last_backup(spark, dest)
    assert written is not None
    version, _, metrics = written
    if previous is None:
        n = int(metrics.get("numOutputRows", "0"))
        counts = {"rows": n, "inserted": n, "updated": 0, "deleted": 0}
    else:
        counts = {
            k: int(metrics.get(m, "0"))
            for k, m in (
                ("inserted", "numTargetRowsInserted"),
                ("updated", "numTargetRowsUpdated"),
                ("deleted", "numTargetRowsDeleted"),
                ("rows", "numSourceRows"),
            )
        }
    return version, info, counts


def _merge(spark: Any, dest: str, diff: Any, keys: Sequence[str], info: BackupInfo) -> None:
    """One Delta MERGE of a diff into the backup (module docstring): its one commit carries
    `info` (Delta takes a commit's userMetadata from the session setting)."""
    from delta.tables import DeltaTable

    target = DeltaTable.forPath(spark, dest)
    on = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in keys)
    columns = [c for c in diff.columns if c != IS_DELETED]
    assign: dict[str, Any] = {f"`{c}`": f"s.`{c}`" for c in columns}
    conf = "spark.databricks.delta.commitInfo.userMetadata"
    old = spark.conf.get(conf, None)
    spark.conf.set(conf, info.to_json())
    try:
        (
            target.alias("t")
            .merge(diff.alias("s"), on)
            .whenMatchedDelete(condition=f"s.`{IS_DELETED}`")
            .whenMatchedUpdate(condition=f"NOT s.`{IS_DELETED}`", set=assign)
            .whenNotMatchedInsert(condition=f"NOT s.`{IS_DELETED}`", values=assign)
            .execute()
        )
    finally:
        if old is None:
            spark.conf.unset(conf)
        else:
            spark.conf.set(conf, old)


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
    change = (
        f"{counts['rows']} rows"
        if info.kind == "full"
        else f"{counts['rows']} changed rows (+{counts['inserted']} ~{counts['updated']} "
        f"-{counts['deleted']})"
    )
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
