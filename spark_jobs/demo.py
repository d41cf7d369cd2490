"""The main job (`make demo`): the whole product in a few minutes, on one machine.

1. start a local cluster of real processes (3 masters, 3 tablet servers) in a temporary dir;
2. create a table with hash and range partitions and load rows through the client;
3. read them back with the client, and with Spark through the "tessera" DataSource (one
   partition per tablet), and run a Spark SQL query over it;
4. write a derived table through the DataSource and check it;
5. `tessera cluster ksck`; the orphan sweep and the schema audit (dry run); an audit snapshot
   of the catalog into Delta, queried with Spark SQL (VERSION AS OF);
6. stop the cluster and print a short summary.

`--keep DIR` leaves the cluster running in DIR (stop it with `tessera cluster down --dir DIR`).
The Spark session starts first: a JVM forked after gRPC threads exist in the process fails.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

ROWS = 200_000


def step(msg: str) -> None:
    print(f"==> {msg}", flush=True)


@contextlib.contextmanager
def timed(results: list[tuple[str, str, float]], what: str, detail: str = "") -> Iterator[None]:
    t0 = time.perf_counter()
    yield
    results.append((what, detail, time.perf_counter() - t0))


def rows(lo: int, hi: int) -> pa.Table:
    ids = pa.array(range(lo, hi), pa.int64())
    return pa.table(
        {
            "region": pa.array([("eu", "us", "ap")[i % 3] for i in range(lo, hi)]),
            "id": ids,
            "amount": pc.multiply(ids, 0.25),
            "note": pa.array([None if i % 10 == 0 else f"order {i}" for i in range(lo, hi)]),
        }
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--keep", help="keep the cluster running in this directory")
    args = p.parse_args(argv)
    results: list[tuple[str, str, float]] = []
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tessera-demo-"))

    step("starting Spark (local[2], Delta, the tessera data source)")
    from spark_jobs.session import build_session

    with timed(results, "spark session"):
        spark = build_session(
            "tessera-demo",
            warehouse_dir=str(base / "warehouse"),
            metastore_dir=str(base / "metastore"),
        )

    from service.client.sync import SyncClient
    from service.common.partition import HashBucketSchema, PartitionSchema, RangeSchema
    from service.common.predicates import ColumnPredicate
    from service.common.schema import ColumnType, Schema
    from service.tools import ksck_cmd, local_cluster
    from spark_jobs.jobs import audit_snapshot, orphan_sweep, schema_audit

    step(f"starting a local cluster in {base / 'cluster'}")
    with timed(results, "cluster up", "3 masters, 3 tablet servers"):
        record = local_cluster.up(base / "cluster", 3, 3, progress=lambda m: print(f"    {m}"))
    masters = record.master_addresses
    mlist = ",".join(masters)
    # The cluster is secured (mutual TLS): `up` wrote the admin's credentials here.
    creds_dir = str(base / "cluster" / "credentials")
    code = 0
    try:
        client = SyncClient(
            masters, timeout=60, credentials=local_cluster.credentials(base / "cluster")
        )
        schema = Schema.build(
            [
                ("region", ColumnType.STRING),
                ("id", ColumnType.INT64),
                ("amount", ColumnType.DOUBLE),
                ("note", ColumnType.STRING),
            ],
            key=("region", "id"),
        )
        partitioning = PartitionSchema(
            hash=(HashBucketSchema(("id",), 4),),
            range=RangeSchema(("region",)),
            split_rows=(("f",), ("t",)),
        )
        step("create table orders: 4 hash buckets on id x 3 ranges on region = 12 tablets")
        with timed(results, "create table", "12 tablets x 3 replicas RUNNING"):
            client.call("create_table", "orders", schema, partitioning, num_replicas=3)
        data = rows(0, args.rows)
        step(f"load {args.rows:,} rows through the client (batched per tablet leader)")
        with timed(results, "load", f"{args.rows:,} rows"):
            r = client.write("orders", data, "insert")
        assert not r.errors, r.errors[:3]
        with timed(results, "client scan", "region = 'eu' AND id < 1000, pruned"):
            tokens = client.scan_tokens(
                "orders",
                predicates=[
                    ColumnPredicate("region", "EQ", ("eu",)),
                    ColumnPredicate("id", "LT", (1000,)),
                ],
            )
            got = pa.Table.from_batches(
                [b for t in tokens for b in client.scan_batches(t)]
            ).num_rows
        print(f"    {got} rows from {len(tokens)} of 12 tablets")

        step("Spark: read through the tessera data source, SQL over a temporary view")
        with timed(results, "spark read", f"{args.rows:,} rows, 12 partitions"):
            spark.sql(
                f"CREATE OR REPLACE TEMPORARY VIEW orders USING tessera "
                f"OPTIONS (masters '{mlist}', credentials '{creds_dir}', table 'orders')"
            )
            agg = spark.sql(
                "SELECT region, count(*) AS n, round(sum(amount), 2) AS total, "
                "count(note) AS with_note FROM orders GROUP BY region ORDER BY region"
            ).collect()
        for row in agg:
            print(
                f"    {row.region}: {row.n:,} orders, total {row.total:,.2f}, "
                f"{row.with_note:,} with a note"
            )
        assert sum(row.n for row in agg) == args.rows

        step("Spark: write a derived table through the data source")
        client.call(
            "create_table",
            "big_orders",
            schema,
            PartitionSchema(hash=(HashBucketSchema(("id",), 3),), range=RangeSchema(())),
        )
        with timed(results, "spark write", "amount > 40000"):
            big = spark.sql("SELECT * FROM orders WHERE amount > 40000")
            expected = big.count()
            big.write.format("tessera").option("masters", mlist).option(
                "credentials", creds_dir
            ).option("table", "big_orders").mode("append").save()
        n = (
            spark.read.format("tessera")
            .option("masters", mlist)
            .option("credentials", creds_dir)
            .option("table", "big_orders")
            .load()
            .count()
        )
        print(f"    wrote {expected:,} rows; read back {n:,}")
        assert n == expected

        step("tessera cluster ksck")
        with timed(results, "ksck"):
            code = ksck_cmd.main(["ksck", "--masters", mlist, "--credentials", creds_dir])
        print(f"    ksck exit code {code} ({'healthy' if code == 0 else 'NOT healthy'})")

        step("reconciliation jobs (dry run) and a Delta audit snapshot")
        with timed(results, "jobs", "orphan_sweep, schema_audit, audit_snapshot"):
            for job in (orphan_sweep, schema_audit, audit_snapshot):
                rc = job.main(["--masters", mlist, "--credentials", creds_dir])
                print(f"    {job.__name__.rsplit('.', 1)[-1]}: exit {rc}")
        tables = spark.sql(
            "SELECT name, state, schema_version FROM tessera_audit.tables VERSION AS OF 0 "
            "ORDER BY name"
        ).collect()
        print(
            "    tessera_audit.tables VERSION AS OF 0: "
            + ", ".join(f"{t.name} ({t.state}, schema v{t.schema_version})" for t in tables)
        )
        client.close()
    finally:
        if not args.keep:
            step("stopping the cluster")
            local_cluster.down(base / "cluster")
        spark.stop()
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)

    print()
    print(f"{'step':<16} {'what':<44} {'seconds':>8}")
    for what, detail, secs in results:
        print(f"{what:<16} {detail:<44} {secs:>8.2f}")
    print("demo finished: " + ("everything healthy" if code == 0 else "ksck reported problems"))
    return code


if __name__ == "__main__":
    sys.exit(main())
