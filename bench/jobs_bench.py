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

Then audit snapshots as a job that runs every few minutes would write them (`--audit-only` runs
just this step), in an audit database of their own (the one above is dropped first):

  S  the `--tablets` inventory (its own tables, servers and masters too) written over a previous
     snapshot of it in which about 1% of the rows changed: leaders moved (the tablet row, two
     catalog replicas, the tablet's hosted replicas), tablets dropped and added, one table
     altered, 1% of the servers' heartbeats, every master's index. The timed write is the
     incremental one: the first write of that inventory into the empty database comes before
     it and is reported apart (`first writes into an empty database: F s / f s`).
  s  the same for a small catalog: 20 tables of 15 tablets on 12 servers, 2% of the tablets
     changed (six), the database emptied again first (its first write is f).
  U  a snapshot of that small catalog unchanged (same master term and committed index, a new
     snapshot id): nothing is written.

The line: `audit-snapshot: N tablets S s, 20 tables s s, unchanged U s`, then the goals (S under
30 s, s under 10 s, U under 5 s) and the first writes. A benchmark prints; it does not assert.
All of it runs in the bench's one Spark session, in this order, so s and U come from a JVM that
the large catalog has warmed up (a job's JVM is a fresh one: its first snapshot pays more).

Then backups (spark_jobs/jobs/backup.py, restore.py) on a real local cluster (1 master, 3
tablet servers): a table of `--backup-rows` rows (3 million) in 6 tablets is loaded through the
client, backed up in full into a Delta table, 1% of its rows are updated (spread over every
tablet), an incremental backup appends them (checked: as many changed rows, none deleted), and
the newest backup, the chain folded, is restored under a new name (checked row count). The
last line: `backup: N rows, full F s, incremental I s, restore R s`; the goal is I under a fifth
of F.

Usage: python -m bench.jobs_bench [--tablets 100000] [--tservers 1000] [--tables 100]
       [--backup-rows 3000000] [--audit-only | --backup-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import importlib
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

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


def mutate(inv: Inventory, snapshot_id: str, fraction: float = 0.01, seed: int = 11) -> Inventory:
    """A later snapshot of `inv` in which about `fraction` of the rows changed (module
    docstring): of that many tablets, nine in ten get a new leader and one in ten is dropped;
    as many new tablets as dropped ones appear in the last table; `fraction` of the servers
    report a new heartbeat age; every master is at the new committed index; one table altered.
    """
    rng = random.Random(seed)
    index = inv.stamp.committed_index + 1 + len(inv.tablets)
    stamp = SnapshotStamp(
        snapshot_id, inv.stamp.taken_at + dt.timedelta(minutes=5), inv.stamp.master_term, index
    )
    picked = rng.sample(range(len(inv.tablets)), max(1, round(fraction * len(inv.tablets))))
    dropped = {inv.tablets[i].tablet_id for i in picked[::10]}
    new_leader = {}
    peers: dict[str, list[str]] = {}
    for r in inv.replicas:
        peers.setdefault(r.tablet_id, []).append(r.ts_uuid)
    for i in picked:
        t = inv.tablets[i]
        if t.tablet_id not in dropped:
            others = [u for u in peers.get(t.tablet_id, []) if u != t.leader_uuid]
            if others:
                new_leader[t.tablet_id] = rng.choice(others)
    out = Inventory(stamp)
    out.tables = list(inv.tables)
    if out.tables:
        last = out.tables[-1]
        out.tables[-1] = dataclasses.replace(
            last, schema_version=last.schema_version + 1, altered_time_us=index
        )
    for t in inv.tablets:
        if t.tablet_id in dropped:
            continue
        leader = new_leader.get(t.tablet_id)
        out.tablets.append(dataclasses.replace(t, leader_uuid=leader) if leader else t)
    for r in inv.replicas:
        if r.tablet_id in dropped:
            continue
        leader = new_leader.get(r.tablet_id)
        out.replicas.append(dataclasses.replace(r, is_leader=r.ts_uuid == leader) if leader else r)
    for h in inv.hosted:
        if h.tablet_id in dropped:
            continue
        leader = new_leader.get(h.tablet_id)
        if leader:
            role = "LEADER" if h.ts_uuid == leader else "FOLLOWER"
            h = dataclasses.replace(h, role=role, leader_uuid=leader, term=h.term + 1)
        out.hosted.append(h)
    # New tablets in the last table, as many as were dropped, on servers picked at random.
    table_id = inv.tables[-1].table_id if inv.tables else "table-new"
    servers = [s.ts_uuid for s in inv.tservers]
    for k in range(len(dropped)):
        tablet_id = f"new-{snapshot_id}-{k:06d}"
        members = rng.sample(servers, min(3, len(servers)))
        out.tablets.append(
            TabletRow(tablet_id, table_id, "RUNNING", b"", b"", members[0], 1, 2, "", index)
        )
        for j, u in enumerate(members):
            out.replicas.append(ReplicaRow(tablet_id, table_id, u, "VOTER", j == 0, ""))
            out.hosted.append(
                HostedRow(
                    u, tablet_id, table_id, "new", "READY", "RUNNING",
                    "LEADER" if j == 0 else "FOLLOWER", 1, members[0], 2, 1, True, 0, 0, "",
                )
            )  # fmt: skip
    beat = set(rng.sample(range(len(inv.tservers)), max(1, round(fraction * len(inv.tservers)))))
    out.tservers = [
        dataclasses.replace(s, millis_since_heartbeat=s.millis_since_heartbeat + 1)
        if i in beat
        else s
        for i, s in enumerate(inv.tservers)
    ]
    out.masters = [dataclasses.replace(m, commit_index=index) for m in inv.masters]
    return out


def renamed(inv: Inventory, snapshot_id: str) -> Inventory:
    """`inv` under another snapshot id: the same catalog, at the same term and index."""
    return dataclasses.replace(inv, stamp=dataclasses.replace(inv.stamp, snapshot_id=snapshot_id))


def drop_audit(spark: Any) -> None:
    """Drop the audit database and delete its directory, so the next snapshot is a first one."""
    from spark_jobs.audit import DATABASE
    from spark_jobs.catalog import table_path

    where = urlparse(table_path(spark, DATABASE, "x")).path.rsplit("/", 1)[0]
    spark.sql(f"DROP DATABASE IF EXISTS {DATABASE} CASCADE")
    shutil.rmtree(where, ignore_errors=True)
    # Delta caches each table's log by path: a table made again at that path starts afresh.
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
    spark.catalog.clearCache()


def audit_snapshots(spark: Any, n_tablets: int, n_servers: int, n_tables: int) -> str:
    """Incremental audit snapshots of a large and a small catalog and an unchanged one (module
    docstring); the `audit-snapshot:` line."""
    from spark_jobs.audit import write_snapshot

    def timed(inv: Inventory, expect: str) -> float:
        t0 = time.perf_counter()
        done = write_snapshot(spark, inv)
        secs = time.perf_counter() - t0
        if done.status != expect:  # a benchmark reports, it does not assert
            status(f"  {inv.stamp.snapshot_id}: {done.status}, expected {expect}")
        return secs

    drop_audit(spark)
    t0 = time.perf_counter()
    big = renamed(generate(n_tablets, n_servers, n_tables), "big-1")
    big2 = mutate(big, "big-2")
    status(f"audit: generated in {time.perf_counter() - t0:.1f}s: {big2.summary()}")
    big_first = timed(big, "written")
    status(f"audit: first snapshot of {n_tablets} tablets in {big_first:.1f}s")
    big_inc = timed(big2, "written")
    status(f"audit: a snapshot with ~1% of the rows changed in {big_inc:.1f}s")
    drop_audit(spark)
    small = renamed(generate(300, 12, 20), "small-1")
    small2 = mutate(small, "small-2", fraction=0.02)
    small_first = timed(small, "written")
    status(f"audit: first snapshot of 20 tables in {small_first:.1f}s")
    small_inc = timed(small2, "written")
    status(f"audit: 20 tables, a few changes, in {small_inc:.1f}s")
    unchanged = timed(renamed(small2, "small-3"), "unchanged")
    status(f"audit: unchanged in {unchanged:.1f}s")
    drop_audit(spark)
    met = big_inc < 30 and small_inc < 10 and unchanged < 5
    return (
        f"audit-snapshot: {n_tablets} tablets {big_inc:.1f} s, 20 tables {small_inc:.1f} s, "
        f"unchanged {unchanged:.1f} s (goals < 30 / 10 / 5 s: {'met' if met else 'MISSED'}; "
        f"first writes into an empty database: {big_first:.1f} s / {small_first:.1f} s)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tablets", type=int, default=100_000)
    p.add_argument("--tservers", type=int, default=1_000)
    p.add_argument("--tables", type=int, default=100)
    p.add_argument("--backup-rows", type=int, default=3_000_000)
    p.add_argument("--audit-only", action="store_true", help="only the audit-snapshot step")
    p.add_argument("--backup-only", action="store_true", help="only the backup step")
    args = p.parse_args(argv)

    from spark_jobs.audit import write_snapshot
    from spark_jobs.jobs import RECONCILIATION
    from spark_jobs.session import build_session

    with tempfile.TemporaryDirectory(prefix="bench-jobs-") as tmp:
        spark = build_session(
            "bench-jobs", warehouse_dir=str(Path(tmp) / "wh"), metastore_dir=str(Path(tmp) / "ms")
        )
        if args.audit_only or args.backup_only:
            line = (
                audit_snapshots(spark, args.tablets, args.tservers, args.tables)
                if args.audit_only
                else backups(spark, Path(tmp), args.backup_rows)
            )
            spark.stop()
            print(line)
            return 0
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
        audit_line = audit_snapshots(spark, args.tablets, args.tservers, args.tables)
        backup_line = backups(spark, Path(tmp), args.backup_rows)
        spark.stop()
    print(
        f"jobs at scale: {args.tablets:,} tablets, {3 * args.tablets:,} replicas, "
        f"{args.tservers:,} tablet servers, local[2]"
    )
    for job, secs, detail in timings:
        goal = "(goal < 60 s)" if secs < 60 else "(GOAL MISSED: 60 s)"
        print(f"  {job:<16} {secs:>7.1f} s  {goal}  {detail}")
    print(audit_line)
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
            assert (counts["changed"], counts["deleted"]) == (len(changed), 0), counts
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
