"""Restore a Tessera table from a backup chain (spark_jobs/jobs/backup.py) at any version.

    spark-submit spark_jobs/jobs/restore.py --masters HOST:PORT,... --source PATH [--version N]
        [--table NAME] [--replicas N]
    tessera jobs run restore --dir DIR --source PATH [--version N] [--table NAME]

Reads backup N of the Delta table at PATH (default: the newest) with `read_backup`, which folds
the backup chain up to version N into the backed-up table as of backup N
(docs/design/tablets.md#R7), and the metadata that backup's commit carries: the table's name,
schema, partitioning and replica count. Creates the table (under its old name, or `--table NAME`;
refused if a table of that name exists) with that schema and partitioning, then writes every
row through the `tessera` source (INSERT). The restored table equals a snapshot scan of the
original at the backup's timestamp, row for row.

Exit codes: 0 done, 1 error. The last line is one summary:
`restore: TABLE from PATH version V (backup at TIME): N rows in S s`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import sys
from collections.abc import Sequence
from typing import Any

from service.client.sync import SyncClient
from service.common.errors import AlreadyExists, NotFound
from service.common.hybrid_time import describe
from service.common.schema_codec import partition_schema_from_pb
from service.pb import common_pb2
from spark_jobs.jobs.backup import (
    BackupInfo,
    cluster_parser,
    last_backup,
    read_backup,
    run_cluster_job,
)

__all__ = ["main", "restore"]

JOB = "restore"


def _say(text: str) -> None:
    print(f"{JOB}: {text}", flush=True)


def restore(
    spark: Any,
    client: SyncClient,
    masters: Sequence[str],
    source: str,
    *,
    version: int | None = None,
    table: str | None = None,
    replicas: int | None = None,
    credentials_dir: str | None = None,
) -> tuple[str, int, BackupInfo, int]:
    """Recreate the table backed up at `source` as of Delta `version` (module docstring).
    Returns (table name, version, the backup's metadata, rows written)."""
    found = last_backup(spark, source, version)
    if found is None:
        raise NotFound(f"{source}: no Delta table (no backups there)")
    v, info, _ = found
    name = table or info.table
    schema = info.table_schema()
    df = read_backup(spark, source, v)
    ps = partition_schema_from_pb(
        common_pb2.PartitionSchemaPB.FromString(base64.b64decode(info.partition_schema)), schema
    )
    existing = {t.name for t in client.call("list_tables")}
    if name in existing:
        raise AlreadyExists(
            f"table {name!r} exists: restore under another name (--table NAME), or delete it first"
        )
    n_replicas = replicas or info.num_replicas
    _say(
        f"creating {name!r} ({len(schema.columns)} columns, backup of {info.table!r} at "
        f"{describe(info.snapshot_timestamp)}, Delta version {v}), {n_replicas} replicas"
    )
    client.call("create_table", name, schema, ps, num_replicas=n_replicas)
    _say("writing the rows")
    writer = (
        df.write.format("tessera")
        .option("masters", ",".join(masters))
        .option("table", name)
        .option("operation", "insert")
        # The table is new: a bulk load (no transaction staging millions of rows in memory),
        # and a restore that fails deletes it rather than leave part of the rows.
        .option("transactional", "false")
        .mode("append")
    )
    if credentials_dir:
        writer = writer.option("credentials", credentials_dir)
    try:
        writer.save()
    except BaseException:
        _say(f"the restore failed: deleting the partly written {name!r}")
        with contextlib.suppress(Exception):
            client.call("delete_table", name)
        raise
    rows = df.count()
    return name, v, info, rows


def _run(
    args: argparse.Namespace,
    spark: Any,
    client: SyncClient,
    masters: list[str],
    creds_dir: str | None,
) -> str:
    name, v, info, rows = restore(
        spark,
        client,
        masters,
        args.source,
        version=args.version,
        table=args.table,
        replicas=args.replicas,
        credentials_dir=creds_dir,
    )
    return (
        f"{name} from {args.source} version {v} (backup at "
        f"{describe(info.snapshot_timestamp)}): {rows} rows"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = cluster_parser(JOB, __doc__ or JOB)
    p.add_argument("--source", required=True, help="the Delta table holding the backups")
    p.add_argument("--version", type=int, help="the Delta version (backup) to restore")
    p.add_argument("--table", help="the new table's name (default: the backed-up table's)")
    p.add_argument("--replicas", type=int, help="replicas per tablet (default: the backup's)")
    return run_cluster_job(JOB, p, argv, _run)


if __name__ == "__main__":
    sys.exit(main())
