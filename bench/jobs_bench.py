"""Reconciliation jobs at scale (`make bench-jobs`): a synthetic catalog through the job code.

A generator builds an inventory of `--tablets` tablets (default 100,000) in `--tables` tables,
3 replicas each (300,000) on `--tservers` tablet servers (1,000), every replica also listed by
its server, with a few planted problems (orphans, replicas of deleted tablets, stale schemas).
Then, on local[2]:

  audit_snapshot  the inventory appended to the Delta audit tables (the job's write path)
  orphan_sweep    run with --snapshot (read back from Delta, findings, findings appended)
  schema_audit    the same
  rebalance_plan  the same (when the rebalancing job exists)

Each line prints the wall time; the goal is under 60 s each. The planted problems must be found
exactly, so the figures are for correct runs.

Then backups (spark_jobs/jobs/backup.py, restore.py) on a real local cluster (1 master, 3
tablet servers): a table of `--backup-rows` rows (3 million) in 6 tablets is loaded through the
client, backed up in full into a Delta table, 1% of its rows are updated (spread over every
tablet), an incremental backup merges them, and the newest backup is restored under a new name
(checked row count). The last line: `backup: N rows, full F s, incremental I s, restore R s`;
the goal is I under a fifth of F.

Usage: python -m bench.jobs_bench [--tablets 100000] [--tservers 1000] [--tables 100]
       [--backup-rows 3000000]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import random
import sys
import tempfile
import time
from pathlib import Path

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

PLANTED = {"orphan_replica": 5, "replica_of_deleted_tablet": 6, "stale_schema_replica": 9}
JOB_OF = {
    "orphan_replica": "orphan_sweep",
    "replica_of_deleted_tablet": "orphan_sweep",
    "stale_schema_replica": "schema_audit",
}


def status(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def generate(n_tablets: int, n_servers: int, n_tables: int, seed: int = 7) -> Inventory:
    rng = random.Random(seed)
    stamp = SnapshotStamp("bench", dt.datetime.now(dt.UTC), 3, 10 * n_tablets)
    inv = Inventory(stamp)
    servers = [f"ts-{i:05d}" for i in range(n_servers)]
    inv.tservers = [
        TServerRow(u, f"10.0.{i // 250}.{i % 250}:7050", True, 100, 0, 0, True, "")
        for i, u in enumerate(servers)
    ]
    inv.masters = [
        MasterRow(
            f"master-{i}",
            f"10.1.0.{i}:7051",
            "LEADER" if i == 0 else "FOLLOWER",
            3,
            10 * n_tablets,
            "",
        )
        for i in range(3)
    ]
    per_table = n_tablets // n_tables
    for t in range(n_tables):
        table_id = f"table-{t:05d}"
        state = "REMOVED" if t == 0 else "RUNNING"  # table 0 was deleted
        inv.tables.append(TableRow(table_id, f"t{t}", state, 2, 3, "bench", 0, 0))
        for k in range(per_table):
            tablet_id = f"{t:05d}-{k:06d}"
            peers = rng.sample(servers, 3)
            inv.tablets.append(
                TabletRow(
                    tablet_id,
                    table_id,
                    "DELETED" if t == 0 else "RUNNING",
                    k.to_bytes(4, "big"),
                    (k + 1).to_bytes(4, "big"),
                    peers[0],
                    5,
                    2,
                    "",
                    0,
                )
            )
            for j, u in enumerate(peers):
                inv.replicas.append(ReplicaRow(tablet_id, table_id, u, "VOTER", j == 0, ""))
                if t == 0 and k >= 2:
                    continue  # deleted table: only tablets 0 and 1 still on disk (6 replicas)
                version = 1 if (t == 1 and k < 3) else 2  # 3 tablets x 3 replicas stale
                inv.hosted.append(
                    HostedRow(
                        u,
                        tablet_id,
                        table_id,
                        f"t{t}",
                        "READY",
                        "RUNNING",
                        "LEADER" if j == 0 else "FOLLOWER",
                        2,
                        peers[0],
                        version,
                        5,
                        True,
                        1000,
                        1 << 20,
                        "",
                    )
                )
    for i in range(PLANTED["orphan_replica"]):
        inv.hosted.append(
            HostedRow(
                servers[i],
                f"orphan-{i}",
                "table-x",
                "x",
                "READY",
                "RUNNING",
                "LEADER",
                1,
                servers[i],
                0,
                0,
                True,
                0,
                0,
                "",
            )
        )
    return inv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tablets", type=int, default=100_000)
    p.add_argument("--tservers", type=int, default=1_000)
    p.add_argument("--tables", type=int, default=100)
    p.add_argument("--backup-rows", type=int, default=3_000_000)
    args = p.parse_args(argv)

    from spark_jobs.audit import write_snapshot
    from spark_jobs.jobs import RECONCILIATION
    from spark_jobs.session import build_session

    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
        spark = build_session(
            "bench-jobs", warehouse_dir=str(Path(tmp) / "wh"), metastore_dir=str(Path(tmp) / "ms")
        )
        t0 = time.perf_counter()
        inv = generate(args.tablets, args.tservers, args.tables)
        status(f"generated in {time.perf_counter() - t0:.1f}s: {inv.summary()}")
        timings: list[tuple[str, float, str]] = []
        t0 = time.perf_counter()
        counts = write_snapshot(spark, inv).counts
        timings.append(
            ("audit_snapshot", time.perf_counter() - t0, f"{sum(counts.values()):,} rows")
        )
        status(f"audit snapshot written in {timings[-1][1]:.1f}s")
        for job in RECONCILIATION:
            if job == "audit_snapshot":
                continue
            module = importlib.import_module(f"spark_jobs.jobs.{job}")
            t0 = time.perf_counter()
            rc = module.main(
                ["--snapshot", "bench", "--run-id", f"bench-{job}", "--format", "json"]
            )
            secs = time.perf_counter() - t0
            found = spark.sql(
                f"SELECT kind, count(*) AS n FROM tessera_audit.findings "
                f"WHERE run_id = 'bench-{job}' GROUP BY kind"
            ).collect()
            kinds = {r.kind: r.n for r in found}
            expected = {k: v for k, v in PLANTED.items() if JOB_OF[k] == job}
            ok = "ok" if kinds == expected or job not in JOB_OF.values() else "MISMATCH"
            timings.append((job, secs, f"exit {rc}, findings {kinds} {ok}"))
            status(f"{job}: {secs:.1f}s")
        backup_line = backups(spark, Path(tmp), args.backup_rows)
        spark.stop()
    print(
        f"jobs at scale: {args.tablets:,} tablets, {3 * args.tablets:,} replicas, "
        f"{args.tservers:,} tablet servers, local[2]"
    )
    for job, secs, detail in timings:
        goal = "(goal < 60 s)" if secs < 60 else "(GOAL MISSED: 60 s)"
        print(f"  {job:<16} {secs:>7.1f} s  {goal}  {detail}")
    print(backup_line)
    return 0


def backups(spark: object, tmp: Path, n: int) -> str:
    """Full and incremental backup and a restore of an `n`-row table (module docstring)."""
    import numpy as np
    import pyarrow as pa

    from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
    from service.common.schema import ColumnType, Schema
    from service.testing.mini_cluster import MiniCluster
    from spark_jobs.jobs.backup import backup
    from spark_jobs.jobs.restore import restore

    schema = Schema.build(
        [("id", ColumnType.INT64), ("name", ColumnType.STRING), ("x", ColumnType.DOUBLE)], "id"
    )
    ps = PartitionSchema(hash=(HashBucketSchema(("id",), 6),), range=RangeSchema(()))
    with MiniCluster(tmp / "cluster", num_masters=1, num_tservers=3) as cluster:
        masters = cluster.master_addresses
        creds = cluster.credentials_dir()
        with cluster.client(timeout=120) as client:
            client.call("create_table", "bench_backup", schema, ps, num_replicas=3)
            status(f"backups: loading {n:,} rows")
            step = 200_000
            for lo in range(0, n, step):
                ids = np.arange(lo, min(lo + step, n), dtype=np.int64)
                client.write(
                    "bench_backup",
                    pa.table({"id": ids, "name": [f"name-{i}" for i in ids], "x": ids / 7}),
                    "insert",
                )
                status(f"backups: loaded {min(lo + step, n):,}/{n:,}")
            dest = str(tmp / "bench_backup.delta")
            t0 = time.perf_counter()
            backup(spark, client, masters, "bench_backup", dest, credentials_dir=creds)
            full_s = time.perf_counter() - t0
            status(f"backups: full backup in {full_s:.1f}s; updating 1% of the rows")
            changed = np.arange(0, n, 100, dtype=np.int64)
            client.write(
                "bench_backup",
                pa.table({"id": changed, "name": [f"new-{i}" for i in changed], "x": changed / 3}),
                "update",
            )
            t0 = time.perf_counter()
            _, _, counts = backup(
                spark, client, masters, "bench_backup", dest, credentials_dir=creds
            )
            inc_s = time.perf_counter() - t0
            assert counts["updated"] == len(changed), counts
            status(f"backups: incremental in {inc_s:.1f}s; restoring")
            t0 = time.perf_counter()
            _, _, _, rows = restore(
                spark, client, masters, dest, table="bench_restored", credentials_dir=creds
            )
            restore_s = time.perf_counter() - t0
            assert rows == n, rows
    goal = "met" if inc_s < full_s / 5 else "MISSED"
    return (
        f"backup: {n:,} rows, full {full_s:.1f} s, incremental {inc_s:.1f} s, restore "
        f"{restore_s:.1f} s (goal: incremental under a fifth of the full: {goal})"
    )


if __name__ == "__main__":
    sys.exit(main())
